"""On/off switches native-cuda reads from the environment (``LOCKSTEP_STEP_MEMO``,
``LOCKSTEP_DEPENDENT_LAUNCH``, the A/B switches of the evidence runs): one vocabulary for
both, and a word outside it refused naming the variable, never read as the default (a
``LOCKSTEP_STEP_MEMO=no`` used to leave the memos on)."""
from __future__ import annotations

import os

from engines.errors import InputError

ON = ("on", "1", "true", "yes")
OFF = ("off", "0", "false", "no")


def switch(env: str, default: bool = True) -> bool:
    """``env`` as on (True) or off (False); ``default`` when unset or blank."""
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    if text.lower() in ON + OFF:
        return text.lower() in ON
    raise InputError(f"{env} is a switch: on or off", field=env, value=text,
                     remedy=f"set {env}=on or {env}=off, or unset it")


__all__ = ["OFF", "ON", "switch"]
