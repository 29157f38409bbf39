"""``LOCKSTEP_NATIVE_CUDA_GRAPHS``: how a run that builds its own engines asks native-cuda
for graphs on append caches (read without CUDA: it is the engine's setting, not a kernel)."""
from __future__ import annotations

import pytest

from engines.backends.native_cuda import GRAPHS_ENV, graphs_setting
from engines.errors import InputError
from harness.packages import resolve_package


@pytest.mark.parametrize("value,static,dynamic", [
    (None, True, False), ("auto", True, False), ("on", True, True), ("OFF", False, False)])
def test_the_setting_picks_graphs_per_package(monkeypatch, value, static, dynamic):
    if value is None:
        monkeypatch.delenv(GRAPHS_ENV, raising=False)
    else:
        monkeypatch.setenv(GRAPHS_ENV, value)
    assert graphs_setting(resolve_package("tiny_llama_static").spec) is static
    assert graphs_setting(resolve_package("tiny_llama").spec) is dynamic


def test_a_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(GRAPHS_ENV, "yes")
    with pytest.raises(InputError) as err:
        graphs_setting(resolve_package("tiny_llama").spec)
    assert err.value.field == GRAPHS_ENV and "on" in err.value.remedy
