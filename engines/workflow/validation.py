"""Checks on a decode request: re-exported from :mod:`engines.requests`, where they live so
that engines and the oracle can use them without importing the workflow."""
from engines.requests import check_count, check_request, check_token_ids

__all__ = ["check_count", "check_request", "check_token_ids"]
