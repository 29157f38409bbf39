"""Room on the disk for a conversion, asked before writing and named when it runs out.

A converted checkpoint is hundreds of megabytes. Without a check, a full disk shows up as
onnx's bare "No space left on device" halfway through the write, with no path and no size.
``require_room`` refuses up front, naming the folder, what the package needs and what is
free; ``disk_full`` turns a write that still runs out (another process filled the disk)
into the same kind of error. The staging folder is removed either way (``convert``).
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import numpy as np

from engines.errors import InputError

# what a package holds besides its weights (graphs, tokenizer, sidecar), and what the
# estimate may miss (alignment, a tensor kept in float32): a floor plus a share
SLACK_BYTES = 32 * 2**20
SLACK_SHARE = 0.05
FULL = (errno.ENOSPC, errno.EDQUOT)
REMEDY = ("free space on that disk (`lockstep cache prune --keep 1` removes older "
          "conversions), or convert elsewhere: `-o PATH`, or LOCKSTEP_CACHE=DIR for the cache")


def package_bytes(weights: dict[str, np.ndarray], dtype: str) -> int:
    """About what a conversion of ``weights`` to ``dtype`` writes: each weight once, at the
    package dtype's width (a drafter's weights are the target's, so they count once)."""
    width = np.dtype(np.float32 if dtype == "float32" else np.float16).itemsize
    raw = sum(int(w.size) * width for w in weights.values())
    return int(raw * (1 + SLACK_SHARE)) + SLACK_BYTES


def _existing(folder: Path) -> Path:
    """The nearest folder at or above ``folder`` that exists (the output may not yet)."""
    for candidate in (folder, *folder.parents):
        if candidate.is_dir():
            return candidate
    return Path("/")


def require_room(folder: Path, needed: int, what: str) -> None:
    """Refuse to write ``what`` into ``folder`` when its disk has less than ``needed``."""
    free = shutil.disk_usage(_existing(folder)).free
    if free < needed:
        raise InputError(
            f"converting {what} needs about {needed / 1e6:.0f} MB in {folder}, and its disk "
            f"has {free / 1e6:.0f} MB free", field="output folder", value=str(folder),
            remedy=REMEDY)


def disk_full(err: BaseException, folder: Path, what: str) -> InputError | None:
    """The clear error for a write into ``folder`` that ran out of room; None for any other
    failure."""
    if not isinstance(err, OSError) or err.errno not in FULL:
        return None
    free = shutil.disk_usage(_existing(folder)).free
    return InputError(
        f"the disk ran out of room while writing {what} into {folder} ({err.strerror}; "
        f"{free / 1e6:.0f} MB free after removing the partial package)",
        field="output folder", value=str(folder), remedy=REMEDY)
