"""native-cuda's kernels on a CPU, for tests without a GPU: the ``.cu`` source compiled by g++
against ``cpu_shim.h`` (``cpu_module``) and the launcher families run on numpy arrays
(``host_device``). Not an engine: nothing here is fast, and ``expf`` is the C library's."""
