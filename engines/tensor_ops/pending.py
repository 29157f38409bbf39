"""A greedy token id whose 4-byte readback may still be in flight.

``TensorOps.next_token_async`` returns one: on the host the id is known at once
(``ReadyToken``); on a device the copy is queued behind the argmax into pinned memory and
``result()`` waits for it (``DeviceToken``), so the interpreter can queue the next forward
first (``DecodeSession(..., pipelined=True)``). Either way an all-NaN row, which has no
argmax, is refused when the id is asked for, as ``next_token_feed`` refuses it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engines.errors import NonFiniteLogits


class PendingToken:
    """An argmax id, read back or on its way: ``result()`` returns it."""

    def _wait(self) -> int:
        raise NotImplementedError

    def result(self) -> int:
        token = self._wait()
        if token < 0:
            raise NonFiniteLogits("row 0 is all NaN, so it has no argmax", field="logits2d",
                                  value="row 0", remedy="the logits are corrupt upstream")
        return token


class ReadyToken(PendingToken):
    """An id already on the host (-1: the row was all NaN)."""

    def __init__(self, token: int):
        self._token = int(token)

    def _wait(self) -> int:
        return self._token


class DeviceToken(PendingToken):
    """An id being copied into ``host`` (pinned, int32 [1]) on a stream; ``event`` is
    recorded after the copy, so waiting on it waits for this copy and nothing later. Once
    read, the pair goes to ``release`` (the ops reuse it for a later token), if given."""

    def __init__(self, host: Any, event: Any, release: Callable[[Any, Any], None] | None = None):
        self._host = host
        self._event = event
        self._release = release
        self._token: int | None = None

    def _wait(self) -> int:
        if self._token is None:
            self._event.synchronize()
            self._token = int(self._host[0])
            if self._release is not None:
                self._release(self._host, self._event)
                self._host = self._event = self._release = None
        return self._token


__all__ = ["DeviceToken", "PendingToken", "ReadyToken"]
