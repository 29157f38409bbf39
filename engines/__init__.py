"""Engines: the package format, the engine protocol and registry, the workflow interpreter,
the ONNX executor with its op kernels, resident tensor ops, and the backends."""
