"""The native-cuda kernels' launchers, one module per kernel family, each named like its
source file in ``engines/native/kernels``: ``gemv`` launches ``gemv.cu``'s kernels.

``engines.native.cuda_kernels`` and ``engines.native.fused_kernels`` put the families the
array backend and the fused nodes use together, one object a device.
"""
