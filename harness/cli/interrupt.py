"""Ctrl-C: one line and exit status 130 (``harness.cli.main``), saying what was done by then.

A ``KeyboardInterrupt`` anywhere in a command ends it; ``Interrupted`` carries the line to
print where the command can say more than "interrupted" (``lockstep run``: the cells it had
recorded, from its progress counts). The evidence written so far stays; the run manifest is
never marked complete, so ``lockstep report`` shows the run as INCOMPLETE.
"""
from __future__ import annotations

import contextlib


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the command had done by then."""


@contextlib.contextmanager
def counted(progress, what: str = "cells recorded; the run is incomplete"):
    """Turn Ctrl-C inside the block into ``Interrupted("interrupted: N of M <what>")``, N and
    M from ``progress`` (a ``harness.cli.progress.CellProgress``)."""
    try:
        yield
    except KeyboardInterrupt:
        total = "?" if progress.total is None else progress.total
        raise Interrupted(f"interrupted: {progress.done} of {total} {what}") from None
