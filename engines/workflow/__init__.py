"""The workflow interpreter: decode sessions and the state cells they own."""
from engines.workflow.session import DecodeResult, DecodeSession, greedy_decode

__all__ = ["DecodeResult", "DecodeSession", "greedy_decode"]
