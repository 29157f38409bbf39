"""Example third-party engines for lockstep (see lockstep's docs/ENGINES.md)."""
from lockstep_example_engine.engine import OrtBlackBoxEngine, OrtOptimizedEngine

__all__ = ["OrtBlackBoxEngine", "OrtOptimizedEngine"]
