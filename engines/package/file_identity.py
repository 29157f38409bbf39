"""What tells a file apart from its earlier self without reading it: the stat fields that
change whenever its bytes can have changed (device, inode, size, modification and change
times in nanoseconds), as make and git's index use them. Hashes of unchanged files are
remembered by it, so a package loaded again in one process is not read again."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


def identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class IdentityMemo:
    """The last ``size`` values computed, by a key that holds the identities of every file
    they were computed from (so a file written again is computed again)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._values: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value for ``key``, computed (once, under a lock) when it is not kept."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]  # type: ignore[return-value]
            value = compute()
            self._values[key] = value
            while len(self._values) > self.size:
                self._values.popitem(last=False)
            return value
