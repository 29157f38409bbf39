"""The former name of the decode state's owner, kept for imports written against it: the
class is ``engines.workflow.state.DecodeState`` (one owner of cells and position)."""
from engines.workflow.state import SNAPSHOT_MODES, DecodeState

StateService = DecodeState

__all__ = ["SNAPSHOT_MODES", "StateService"]
