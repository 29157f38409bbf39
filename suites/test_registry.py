"""Engine identity in the registry: an engine's `name` is what its results are recorded
under, so no class may report under another engine's name, and a broken plugin is reported
with its own error instead of as an unknown engine."""
from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest

from engines import registry
from engines.backends.ort_cpu import OrtCpuEngine
from engines.errors import (EngineDefinitionError, EngineImportError, LockstepError,
                            UnknownEngine)
from engines.registry import (BUILTIN, ENTRY_POINT_GROUP, check_engine_class, engine_names,
                              get_engine_class, registry_problems, resolve_engine)

HERE = __name__  # "suites.test_registry" when collected by pytest
BROKEN = "lockstep_registry_broken_plugin"


# -- example engine classes (module level, so "suites.test_registry:Class" finds them) ------

class UnnamedOrtCpu(OrtCpuEngine):
    """Forgets its own name: it would record its results as "ort-cpu"."""


class NamedOrtCpu(OrtCpuEngine):
    name = "registry-example"


class ImpostorOrtCpu(OrtCpuEngine):
    name = "ort-cpu"


class CommaNamed(OrtCpuEngine):
    name = "a,b"


class NotAString(OrtCpuEngine):
    name = 7


class NotAnEngine:
    name = "not-an-engine"


# -- faked entry points ---------------------------------------------------------------------

class FakeEntryPoint:
    def __init__(self, name: str, value: str, dist: str | None):
        self.name, self.value, self.group = name, value, ENTRY_POINT_GROUP
        self.dist = SimpleNamespace(name=dist) if dist else None


@pytest.fixture
def plugins(monkeypatch):
    """Replace the installed entry points by the ones a test declares with ``install``."""
    installed: list[FakeEntryPoint] = []

    def fake_entry_points(*, group=None, **_):
        return [ep for ep in installed if group is None or ep.group == group]

    def install(name: str, value: str, dist: str | None = "example-plugin") -> None:
        installed.append(FakeEntryPoint(name, value, dist))
        registry._entries.cache_clear()

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    registry._entries.cache_clear()
    yield install
    registry._entries.cache_clear()


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    """Write an importable module whose body is ``source``; return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        (tmp_path / f"{BROKEN}.py").write_text(source)
        importlib.invalidate_caches()
        sys.modules.pop(BROKEN, None)
        return BROKEN

    yield write
    sys.modules.pop(BROKEN, None)


# -- check_engine_class ---------------------------------------------------------------------

def test_a_subclass_without_its_own_name_is_refused_naming_the_class_and_the_remedy():
    with pytest.raises(EngineDefinitionError) as info:
        check_engine_class(UnnamedOrtCpu)
    err = info.value
    assert err.field == "name" and err.value == "ort-cpu"
    assert f"{HERE}.UnnamedOrtCpu" in err.message
    assert "engines.backends.ort_cpu.OrtCpuEngine" in err.message  # whose name it inherits
    assert 'set `name = "..."` on the class' in err.remedy
    assert f"{HERE}.UnnamedOrtCpu" in err.remedy
    # and the registry refuses it the same way when it is named directly
    with pytest.raises(EngineDefinitionError, match="does not set its own `name`"):
        get_engine_class(f"{HERE}:UnnamedOrtCpu")


@pytest.mark.parametrize("cls, field, needle", [
    (NotAnEngine, "class", "does not derive from engines.engine.Engine"),
    (NotAString, "name", "not a non-empty string"),
    (CommaNamed, "name", "cannot be given on the command line"),
])
def test_other_unusable_classes_are_refused(cls, field, needle):
    with pytest.raises(EngineDefinitionError) as info:
        check_engine_class(cls)
    assert info.value.field == field and needle in info.value.message
    assert f"{HERE}.{cls.__qualname__}" in str(info.value) and info.value.remedy


def test_a_name_other_than_the_registered_one_is_refused():
    with pytest.raises(EngineDefinitionError) as info:
        check_engine_class(NamedOrtCpu, expected_name="something-else")
    err = info.value
    assert err.field == "name" and err.value == "registry-example"
    assert "registered as 'something-else'" in err.message
    assert 'set `name = "something-else"`' in err.remedy
    assert check_engine_class(NamedOrtCpu, expected_name="registry-example") is NamedOrtCpu


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_defines_its_own_name_and_passes(name):
    module_name, _, attr = BUILTIN[name].partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    assert cls.__dict__.get("name") == name
    assert check_engine_class(cls, expected_name=name) is cls
    assert get_engine_class(name) is cls
    assert name in engine_names() and name not in registry_problems()


# -- "package.module:ClassName" references ---------------------------------------------------

def test_a_class_with_its_own_name_loads_by_module_and_class():
    cls = get_engine_class(f"{HERE}:NamedOrtCpu")
    assert cls.__qualname__ == "NamedOrtCpu" and cls.name == "registry-example"
    assert cls is NamedOrtCpu
    assert resolve_engine(f"{HERE}:NamedOrtCpu") == ("registry-example", NamedOrtCpu)
    # naming a built-in class directly is that built-in, not an impostor
    assert resolve_engine("engines.backends.ort_cpu:OrtCpuEngine") == ("ort-cpu", OrtCpuEngine)


def test_a_module_class_named_like_a_builtin_is_refused():
    with pytest.raises(EngineDefinitionError) as info:
        get_engine_class(f"{HERE}:ImpostorOrtCpu")
    err = info.value
    assert "collides with the built-in engine 'ort-cpu'" in err.message
    assert f"{HERE}.ImpostorOrtCpu" in err.message
    assert err.field == "name" and err.value == "ort-cpu" and "set `name" in err.remedy


def test_bad_references_name_what_is_wrong():
    with pytest.raises(EngineDefinitionError, match="has no attribute 'Nope'"):
        get_engine_class(f"{HERE}:Nope")
    with pytest.raises(EngineImportError) as info:
        get_engine_class("lockstep_no_such_module_anywhere:Engine")
    assert info.value.error_type == "ModuleNotFoundError"
    assert "check the module path" in info.value.remedy
    with pytest.raises(UnknownEngine):
        get_engine_class("warp-drive")
    for ref in ("json:dumps", f"{HERE}:NotAnEngine"):  # what was typed, as an engine
        with pytest.raises(EngineDefinitionError, match="not an engine class") as info:
            get_engine_class(ref)
        assert info.value.field == "engine" and info.value.value == ref


# -- entry points ----------------------------------------------------------------------------

def test_an_entry_point_under_its_classes_name_loads(plugins):
    plugins("registry-example", f"{HERE}:NamedOrtCpu")
    assert get_engine_class("registry-example") is NamedOrtCpu
    assert "registry-example" in engine_names()
    assert registry_problems() == {}


def test_an_entry_point_under_another_name_is_refused(plugins):
    plugins("registry-renamed", f"{HERE}:NamedOrtCpu")
    with pytest.raises(EngineDefinitionError) as info:
        get_engine_class("registry-renamed")
    err = info.value
    assert "registered as 'registry-renamed' but its `name` is 'registry-example'" in err.message
    assert 'set `name = "registry-renamed"`' in err.remedy
    assert "registry-renamed" not in engine_names()
    assert "registered as 'registry-renamed'" in registry_problems()["registry-renamed"]


def test_an_entry_point_without_its_own_name_is_refused(plugins):
    plugins("registry-unnamed", f"{HERE}:UnnamedOrtCpu")
    with pytest.raises(EngineDefinitionError, match="inherits 'ort-cpu'"):
        get_engine_class("registry-unnamed")


def test_an_entry_point_named_like_a_builtin_is_refused_naming_its_distribution(plugins):
    plugins("ort-cpu", f"{HERE}:ImpostorOrtCpu", dist="evil-engines")
    for consult in (lambda: get_engine_class("ort-cpu"), lambda: get_engine_class("native-host"),
                    engine_names):
        with pytest.raises(EngineDefinitionError) as info:
            consult()
        assert "collides with the built-in engine 'ort-cpu'" in info.value.message
        assert "evil-engines" in info.value.message and "evil-engines" in info.value.remedy
    assert "evil-engines" in registry_problems()["ort-cpu"]  # seen without raising


def test_an_entry_point_declaring_the_builtin_itself_replaces_nothing(plugins):
    plugins("ort-cpu", BUILTIN["ort-cpu"], dist="lockstep")
    assert get_engine_class("ort-cpu") is OrtCpuEngine
    assert registry_problems() == {}


def test_two_distributions_claiming_one_name_are_reported(plugins):
    plugins("registry-example", f"{HERE}:NamedOrtCpu", dist="first")
    plugins("registry-example", f"{HERE}:ImpostorOrtCpu", dist="second")
    with pytest.raises(EngineDefinitionError, match="both claim the engine name"):
        get_engine_class("registry-example")
    assert "registry-example" not in engine_names()
    assert "'second'" in registry_problems()["registry-example"]


@pytest.mark.parametrize("source, error_type, needle", [
    ("raise RuntimeError('plugin blew up on import')\n", "RuntimeError",
     "plugin blew up on import"),
    ("import lockstep_missing_dependency_of_plugin\n", "ModuleNotFoundError",
     "lockstep_missing_dependency_of_plugin"),
    ("def broken(:\n", "SyntaxError", "invalid syntax"),
])
def test_a_plugin_that_fails_to_import_is_reported_with_its_error(plugins, broken_module,
                                                                  source, error_type, needle):
    module = broken_module(source)
    plugins("registry-broken", f"{module}:Engine", dist="broken-plugin")
    plugins("registry-example", f"{HERE}:NamedOrtCpu")
    with pytest.raises(EngineImportError) as info:
        get_engine_class("registry-broken")
    err = info.value
    assert not isinstance(err, UnknownEngine)
    assert err.error_type == error_type and needle in err.error_message
    assert f"{error_type}: " in err.message and needle in err.message
    assert "broken-plugin" in err.message and "broken-plugin" in err.remedy
    assert err.value == "registry-broken"
    if error_type == "ModuleNotFoundError":
        assert "install the missing module 'lockstep_missing_dependency_of_plugin'" in err.remedy
    problems = registry_problems()
    assert set(problems) == {"registry-broken"} and needle in problems["registry-broken"]
    names = engine_names()  # still works, and lists everything that loads
    assert "registry-broken" not in names
    assert "registry-example" in names and set(BUILTIN) <= set(names)


def test_a_builtin_whose_module_fails_to_import_is_a_reported_problem(plugins, broken_module,
                                                                      monkeypatch):
    module = broken_module("raise RuntimeError('half-installed build')\n")
    monkeypatch.setitem(registry.BUILTIN, "hf", f"{module}:HfEngine")
    registry._entries.cache_clear()
    with pytest.raises(EngineImportError, match="half-installed build"):
        get_engine_class("hf")
    assert "hf" not in engine_names() and "ort-cpu" in engine_names()
    assert "half-installed build" in registry_problems()["hf"]


def test_every_registry_error_is_a_lockstep_error():
    assert issubclass(EngineImportError, EngineDefinitionError)
    assert issubclass(EngineDefinitionError, LockstepError)
    assert not issubclass(EngineDefinitionError, UnknownEngine)
