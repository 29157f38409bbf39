"""``lockstep engines`` and ``lockstep --version``: every engine with its source, version,
capabilities and whether it runs here; broken plugins listed with their error; a name clash
is an error (exit 2). Entry points are faked as in suites/test_registry.py."""
from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace

import pytest

from engines import registry
from engines.backends.ort_cpu import OrtCpuEngine
from engines.engine import Availability
from engines.registry import BUILTIN, ENTRY_POINT_GROUP, get_engine_class, lockstep_version
from harness.cli import main

HERE = __name__
BROKEN = "lockstep_engines_cli_broken_plugin"


class PluginEngine(OrtCpuEngine):
    name = "cli-plugin"
    description = "a plugin engine for the listing"
    batch_invariant = True


class MissingHere(OrtCpuEngine):
    name = "cli-missing-here"

    @classmethod
    def availability(cls):
        return Availability(False, "needs a widget this machine lacks")


class AvailabilityRaises(OrtCpuEngine):
    name = "cli-availability-raises"

    @classmethod
    def availability(cls):
        raise RuntimeError("probe exploded")


class FakeEntryPoint:
    def __init__(self, name: str, value: str, dist: str | None, version: str | None):
        self.name, self.value, self.group = name, value, ENTRY_POINT_GROUP
        self.dist = SimpleNamespace(name=dist, version=version) if dist else None


@pytest.fixture
def plugins(monkeypatch):
    """Only the entry points a test declares with ``install`` are installed."""
    installed: list[FakeEntryPoint] = []

    def fake_entry_points(*, group=None, **_):
        return [ep for ep in installed if group is None or ep.group == group]

    def install(name, value, dist="cli-example-dist", version="1.2.3"):
        installed.append(FakeEntryPoint(name, value, dist, version))
        registry._entries.cache_clear()

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    registry._entries.cache_clear()
    yield install
    registry._entries.cache_clear()


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{BROKEN}.py").write_text("import lockstep_no_such_dependency_xyz\n")
    importlib.invalidate_caches()
    sys.modules.pop(BROKEN, None)
    yield BROKEN
    sys.modules.pop(BROKEN, None)


def listing(capsys, *extra) -> tuple[int, dict[str, dict], str]:
    status = main(["engines", "--json", *extra])
    out, err = capsys.readouterr()
    return status, {row["name"]: row for row in json.loads(out)}, err


def test_builtins_are_listed_with_lockstep_version_capabilities_and_availability(plugins, capsys):
    status, rows, err = listing(capsys)
    assert status == 0 and not err
    assert list(rows) == [*BUILTIN, "http:llama-server"]
    for name, row in ((name, rows[name]) for name in BUILTIN):
        cls = get_engine_class(name)
        assert row["source"] == "built-in" and row["distribution"] == "lockstep"
        assert row["version"] == lockstep_version() and row["target"] == BUILTIN[name]
        assert row["capabilities"] == cls.capabilities().to_dict()
        avail = cls.availability()
        assert (row["available"], row["reason"]) == (avail.ok, avail.reason)
        assert row["problem"] is None and row["clash"] is False


def test_the_server_lockstep_starts_is_listed_with_a_bad_setting_as_its_reason(
        plugins, capsys, monkeypatch, tmp_path):
    """A LOCKSTEP_LLAMA_SERVER that names no program is why http:llama-server cannot run
    here: the variable, its value and the remedy (issue 33)."""
    monkeypatch.setenv("LOCKSTEP_LLAMA_SERVER", str(tmp_path))
    status, rows, err = listing(capsys)
    row = rows["http:llama-server"]
    assert status == 0 and not err and row["available"] is False
    assert f"[field LOCKSTEP_LLAMA_SERVER = '{tmp_path}']" in row["reason"]
    assert "remedy: point LOCKSTEP_LLAMA_SERVER at a llama-server binary" in row["reason"]


def test_a_plugin_is_listed_with_its_distribution_and_version(plugins, capsys):
    plugins("cli-plugin", f"{HERE}:PluginEngine")
    plugins("cli-missing-here", f"{HERE}:MissingHere", dist="other-dist", version="0.0.9")
    status, rows, _ = listing(capsys)
    assert status == 0
    row = rows["cli-plugin"]
    assert (row["source"], row["distribution"], row["version"]) == \
        ("entry point", "cli-example-dist", "1.2.3")
    assert row["capabilities"]["batch_invariant"] is True and row["available"]
    assert row["description"] == "a plugin engine for the listing"
    missing = rows["cli-missing-here"]
    assert not missing["available"] and missing["reason"] == "needs a widget this machine lacks"
    assert missing["problem"] is None  # cannot run here is not broken
    # the table names the same things
    assert main(["engines"]) == 0
    table = capsys.readouterr().out
    for needle in ("cli-plugin", "cli-example-dist", "1.2.3", "needs a widget", "built-in"):
        assert needle in table


def test_a_plugin_that_fails_to_import_is_listed_with_its_import_error(plugins, broken_module,
                                                                         capsys):
    plugins("cli-plugin", f"{HERE}:PluginEngine")
    plugins("cli-broken", f"{broken_module}:Engine", dist="broken-dist")
    status, rows, err = listing(capsys)
    assert status == 1
    broken = rows["cli-broken"]
    assert broken["problem"] and "ModuleNotFoundError" in broken["problem"]
    assert "lockstep_no_such_dependency_xyz" in broken["problem"]
    assert broken["distribution"] == "broken-dist" and broken["capabilities"] is None
    assert not broken["available"] and not broken["clash"]
    assert rows["cli-plugin"]["problem"] is None  # the others stay listed and usable
    assert "cannot load: 'cli-broken'" in err and "lockstep_no_such_dependency_xyz" in err


def test_an_entry_point_named_like_a_builtin_is_a_clash(plugins, capsys):
    plugins("ort-cpu", f"{HERE}:PluginEngine", dist="impostor-dist")
    status, _, err = listing(capsys)
    assert status == 2
    assert "name clash: 'ort-cpu'" in err and "impostor-dist" in err
    main(["engines", "--json"])
    rows = json.loads(capsys.readouterr().out)
    clash = [r for r in rows if r["name"] == "ort-cpu" and r["source"] == "entry point"]
    assert len(clash) == 1 and clash[0]["clash"] and "never replaced" in clash[0]["problem"]
    builtin = [r for r in rows if r["name"] == "ort-cpu" and r["source"] == "built-in"]
    assert builtin and builtin[0]["problem"] is None


def test_two_distributions_claiming_one_name_is_a_clash(plugins, capsys):
    plugins("cli-plugin", f"{HERE}:PluginEngine", dist="first-dist")
    plugins("cli-plugin", f"{HERE}:MissingHere", dist="second-dist")
    assert main(["engines"]) == 2
    captured = capsys.readouterr()
    assert "first-dist" in captured.err and "second-dist" in captured.err
    assert captured.out.count("NAME CLASH") == 2


def test_an_entry_point_declaring_the_builtin_itself_is_no_clash(plugins, capsys):
    plugins("ort-cpu", BUILTIN["ort-cpu"], dist="lockstep")
    status, rows, _ = listing(capsys)
    assert status == 0 and rows["ort-cpu"]["source"] == "built-in"


def test_an_availability_that_raises_is_reported_not_fatal(plugins, capsys):
    plugins("cli-availability-raises", f"{HERE}:AvailabilityRaises")
    status, rows, _ = listing(capsys)
    row = rows["cli-availability-raises"]
    assert status == 0 and not row["available"]
    assert "availability() failed: RuntimeError: probe exploded" in row["reason"]


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"lockstep {lockstep_version()}"
    assert lockstep_version() == importlib.metadata.version("lockstep")
