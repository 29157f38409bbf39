"""The workflow interpreter: decode sessions and the state cells they own."""
from engines.decode_result import DecodeResult
from engines.workflow.session import DecodeSession, greedy_decode

__all__ = ["DecodeResult", "DecodeSession", "greedy_decode"]
