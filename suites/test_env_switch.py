"""native-cuda's A/B switches (``LOCKSTEP_STEP_MEMO``, ``LOCKSTEP_DEPENDENT_LAUNCH``) read one
vocabulary; a word outside it is refused naming the variable, never read as on (issue 33:
``LOCKSTEP_STEP_MEMO=no`` left the memos on)."""
from __future__ import annotations

import pytest

from engines.errors import InputError
from engines.native import dependent_launch, step_memo

SWITCHES = [(step_memo.ENV, step_memo.memo_enabled),
            (dependent_launch.ENV, dependent_launch.requested)]


@pytest.mark.parametrize("env, read", SWITCHES, ids=[env for env, _ in SWITCHES])
@pytest.mark.parametrize("value, on", [(None, True), (" ", True), ("on", True), ("YES", True),
                                       ("1", True), ("off", False), ("no", False),
                                       ("False", False), ("0", False)])
def test_a_switch_reads_on_and_off(monkeypatch, env, read, value, on):
    if value is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, value)
    assert read() is on


@pytest.mark.parametrize("env, read", SWITCHES, ids=[env for env, _ in SWITCHES])
def test_another_word_is_refused_naming_the_variable(monkeypatch, env, read):
    monkeypatch.setenv(env, "of")
    with pytest.raises(InputError) as info:
        read()
    assert (info.value.field, info.value.value) == (env, "of")
    assert f"{env}=off" in info.value.remedy
