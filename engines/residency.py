"""Where a value lives: ``host`` or ``cuda:N``, read from the array itself.

Values are plain arrays (numpy on the host, CuPy on a device); their type carries their
residency, so no wrapper object sits on the decode hot path.
"""
from __future__ import annotations

from typing import Any

import numpy as np

HOST = "host"


def residency_of(value: Any) -> str:
    """Return ``host`` for numpy arrays and scalars, ``cuda:N`` for CuPy arrays."""
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return HOST
    device = getattr(value, "device", None)
    mod = type(value).__module__
    if mod.startswith("cupy") and device is not None:
        return f"cuda:{int(device.id)}"
    raise TypeError(f"cannot tell where a {type(value).__name__} lives")


def is_device(value: Any) -> bool:
    return residency_of(value) != HOST
