"""The measuring child and what it needs: the worker (the only code that runs onnxruntime on a
model being measured), its job, the runner that starts and watches it, and the protocols and
statistics around it. Empty on purpose: the child imports this package and must stay light."""
