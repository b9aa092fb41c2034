"""qualify: a fleet qualification matrix and release-manifest manager for ONNX models.

This package holds the host side of a qualification run: fingerprint, artifact store, the
runner (onnxruntime in a subprocess), statistics, parity, the run itself and the click CLI
(the composition root). Importing it imports nothing heavy.
"""

__version__ = "0.1.0"
