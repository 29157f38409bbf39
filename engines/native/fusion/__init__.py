"""Graph fusion for the native executor: the converter's standard subgraphs (RMSNorm,
rotary, SwiGLU, the static KV write, causal attention) recognised by structure and replaced
by one node each in the ``lockstep.fused`` domain, whose kernels (``ops/fused.py``) compute
the same arithmetic in one launch. Anything not recognised exactly runs node by node."""
from .driver import RECOGNISERS, fuse_nodes
from .graph_view import FUSED_DOMAIN

__all__ = ["FUSED_DOMAIN", "RECOGNISERS", "fuse_nodes"]
