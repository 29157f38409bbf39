"""The positions a conversion is asked to hold, checked before anything is allocated for them.

The rotary tables hold one row per position (``harness.convert.llama_config.rope_tables``: angles,
cos and sin in float64, then float32 initializers), so ``--max-context 100000000`` once
allocated for 40 s and died with numpy's 23.8 GiB ``_ArrayMemoryError``. A context past the
package format's limit (``MAX_CONTEXT_LIMIT``, 2^24) is refused, and so is one whose tables
would not fit in the memory this machine has free, each naming the option, the limit and
the memory it would need.
"""
from __future__ import annotations

import os

from engines.errors import InputError
from engines.package.schema import MAX_CONTEXT_LIMIT

# bytes a (position, head channel) pair costs while a table is built: float64 angles, their
# doubled copy, cos and sin, and the float32 initializers made from them (a whole conversion
# of 2^20 positions x 32 channels peaked 1.0 GiB above the checkpoint, 32 bytes a pair)
BUILD_BYTES = 40


def table_bytes(positions: int, head_dim: int, tables: int = 1) -> int:
    """About the peak memory building ``tables`` cos/sin pairs of ``positions`` rows takes."""
    return positions * head_dim * BUILD_BYTES * tables


def available_memory() -> int | None:
    """Bytes this machine can still allocate without swapping (None: unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_max_context(positions: int, head_dim: int, tables: int = 1,
                      field: str = "--max-context") -> None:
    """Refuse ``positions`` above the format's limit, or whose rotary tables (``tables``
    pairs of ``head_dim`` channels) would not fit in the memory available now."""
    need = table_bytes(positions, head_dim, tables)
    if positions > MAX_CONTEXT_LIMIT:
        raise InputError(f"{positions} positions is above the package format's limit of "
                         f"{MAX_CONTEXT_LIMIT} (2^24); its rotary tables alone would need "
                         f"about {_gib(need)} of memory", field=field, value=positions,
                         remedy=f"use {MAX_CONTEXT_LIMIT} or less (a context past any "
                                f"released model's)")
    free = available_memory()
    if free is not None and need > free:
        fits = free // table_bytes(1, head_dim, tables)
        raise InputError(f"{positions} positions of {head_dim}-channel rotary tables need "
                         f"about {_gib(need)} of memory to build, and this machine has "
                         f"{_gib(free)} available", field=field, value=positions,
                         remedy=f"use {fits} or less, or convert on a machine with more "
                                f"free memory")
