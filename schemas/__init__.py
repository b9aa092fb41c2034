"""Typed documents of qualify: project file, fingerprint, cells, run bundles, manifests.

Every model forbids unknown keys and describes every field; the JSON Schema files beside this
module are generated from them (``python -m schemas.generate``) and checked for drift by a test.
"""
