"""Disk hygiene: a killed convert leaks no staging folder for good, and the conversions
that pile up in the cache can be listed and pruned (by age, size or newest N)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import staging
from harness.cli import main

REPO = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leave(parent: Path, name: str) -> Path:
    path = parent / name
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(b"\0" * 1024)
    return path


def test_stage_removes_what_dead_owners_left_and_keeps_live_ones(tmp_path):
    host = staging._host()
    dead = _dead_pid()
    gone = [_leave(tmp_path, f".pkg.stage-{host}-{dead}-0123abcd"),
            _leave(tmp_path, f".pkg.tmp-{dead}-89abcdef")]  # the older form, no host
    live = _leave(tmp_path, f".pkg.stage-{host}-{os.getpid()}-0badf00d")
    elsewhere = _leave(tmp_path, f".pkg.stage-otherhost-{dead}-feedbeef")  # cannot ask it
    ancient = _leave(tmp_path, f".pkg.stage-otherhost-{dead}-deadbeef")
    old = time.time() - staging.STALE_AFTER - 60
    os.utime(ancient, (old, old))
    unrelated = _leave(tmp_path, ".git")
    fresh = staging.stage(tmp_path / "pkg")
    assert not any(p.exists() for p in gone + [ancient])
    assert live.exists() and elsewhere.exists() and unrelated.exists()
    assert not fresh.exists() and fresh.parent == tmp_path
    assert f"-{os.getpid()}-" in fresh.name and host in fresh.name


KILLED_CONVERT = """
import os, signal, sys
import harness.convert as convert

def write_and_die(ckpt, staged, *args, **kwargs):
    staged.mkdir(parents=True)
    (staged / "target.onnx.data").write_bytes(b"\\0" * 4096)
    os.kill(os.getpid(), signal.SIGKILL)

convert.write_converted = write_and_die
convert.convert(sys.argv[1], sys.argv[2])
"""


def test_a_killed_convert_leaves_nothing_after_the_next_convert(tmp_path):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
    from harness.convert import convert
    from suites.convert_support import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "out" / "pkg"
    killed = subprocess.Popen([sys.executable, "-c", KILLED_CONVERT, str(gguf), str(out)],
                              cwd=REPO, stderr=subprocess.PIPE, text=True)
    _, stderr = killed.communicate(timeout=120)
    assert killed.returncode < 0, stderr  # SIGKILL: no cleanup code ran
    left = [p for p in out.parent.iterdir() if p.name.startswith(".")]
    assert len(left) == 1 and str(killed.pid) in left[0].name
    convert(gguf, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["pkg"]


# -- a disk without room for the conversion ---------------------------------------------------

@pytest.fixture
def tiny_checkpoint(tmp_path):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
    from suites.convert_support import write_tiny_gguf

    return write_tiny_gguf(tmp_path / "tiny.gguf")


def _free(monkeypatch, free: int) -> None:
    import collections

    from harness.convert import disk_room

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_room.shutil, "disk_usage", lambda path: usage(free, 0, free))


def test_convert_refuses_up_front_when_the_disk_lacks_room(tiny_checkpoint, tmp_path,
                                                           monkeypatch, capsys):
    """Named: the folder, what the package needs, what is free, and how to make room;
    nothing is written, not even a staging folder."""
    from harness.convert import disk_room, read_checkpoint

    ckpt = read_checkpoint(tiny_checkpoint, with_tokenizer=False)
    needed = disk_room.package_bytes(ckpt.weights, "float32")
    _free(monkeypatch, needed - 1)
    out = tmp_path / "out" / "pkg"
    assert main(["convert", str(tiny_checkpoint), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"needs about {needed / 1e6:.0f} MB in {out.parent}" in err
    assert f"[field -o = '{out.parent}']" in err and "lockstep cache prune" in err
    assert "Traceback" not in err
    assert not out.parent.exists() or not any(out.parent.iterdir())
    _free(monkeypatch, needed)  # the control: exactly enough room converts
    assert main(["convert", str(tiny_checkpoint), "-o", str(out)]) == 0
    assert (out / "package.yaml").is_file()


@pytest.mark.parametrize("code, named", [(errno.ENOSPC, True), (errno.EDQUOT, True),
                                         (errno.EACCES, False)])
def test_a_write_that_runs_out_of_room_is_named_and_leaves_no_partial_package(
        tiny_checkpoint, tmp_path, monkeypatch, code, named):
    """Another process filled the disk after the check: the half-written package goes and
    the error names the folder and the remedy. Any other OSError is not dressed up."""
    import harness.convert as convert

    from engines.errors import InputError

    def write_and_fail(ckpt, staged, *args, **kwargs):
        staged.mkdir(parents=True)
        (staged / "target.onnx.data").write_bytes(b"\0" * 4096)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(convert, "write_converted", write_and_fail)
    out = tmp_path / "out" / "pkg"
    with pytest.raises((InputError, OSError)) as caught:
        convert.convert(tiny_checkpoint, out)
    if named:
        assert isinstance(caught.value, InputError)
        assert caught.value.field == "output folder" and caught.value.value == str(out.parent)
        assert "ran out of room" in str(caught.value) and "remedy:" in str(caught.value)
    else:
        assert not isinstance(caught.value, InputError) and caught.value.errno == code
    assert list(out.parent.iterdir()) == []


# -- lockstep cache list / prune --------------------------------------------------------------

def _conversion(root: Path, name: str, age_days: float, size: int, reference: str | None = None):
    folder = root / name
    folder.mkdir(parents=True)
    spec = {"format": 1, "name": "x"}
    if reference:
        spec["reference"] = {"folder": reference, "content_hash": "sha256:" + "0" * 64}
    (folder / "package.yaml").write_text(json.dumps(spec))
    (folder / "weights.bin").write_bytes(b"\0" * size)
    sidecar = folder / "checkpoint.json"
    sidecar.write_text("{}")
    when = time.time() - age_days * 86400
    os.utime(sidecar, (when, when))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    from harness.convert.cache import converted_root

    root = converted_root()
    made = {
        "old32": _conversion(root, "ck-dynamic-float32-aaaaaaaaaaaa", 9, 4000),
        "new32": _conversion(root, "ck-dynamic-float32-bbbbbbbbbbbb", 1, 4000),
        "twin": _conversion(root, "ck-dynamic-float32-cccccccccccc", 5, 4000),
        "half": _conversion(root, "ck-dynamic-float16-dddddddddddd", 0.5, 2000,
                            reference="ck-dynamic-float32-cccccccccccc"),
        "draft": _conversion(root, "ck-dynamic-float32-draft24-eeeeeeeeeeee", 3, 8000),
    }
    made["staging"] = _leave(root, f".ck.stage-{staging._host()}-{_dead_pid()}-0123abcd")
    return made


def _left(cache) -> set[str]:
    return {k for k, p in cache.items() if p.exists()}


def test_cache_list_shows_every_conversion_and_stale_staging(cache, capsys):
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    for key in ("old32", "new32", "twin", "half", "draft"):
        assert cache[key].name[-12:] in out.replace("\n", "").replace("│", "").replace(" ", "")
    assert "staging (stale)" in out


def test_cache_list_shows_genai_builds_their_packages_and_gguf_loads(cache, capsys):
    """onnxruntime-genai's builds (ort-genai) and transformers' GGUF loads (hf) are caches
    too (~1 GB for SmolLM2 alone): listed with their size; prune leaves them."""
    from engines.backends.genai_build import cache_folder
    from engines.backends.hf import gguf_load_folder

    made = {"genai build": cache_folder() / "ck-cpu-fp32",
            "genai package": cache_folder() / "ck-cpu-fp32-package",
            "gguf load": gguf_load_folder() / "0123abcd-transformers-5"}
    for (kind, folder), marker in zip(made.items(), ("build.json", "package.yaml",
                                                     "model.safetensors")):
        folder.mkdir(parents=True)
        (folder / marker).write_bytes(b"\0" * 3 * 1024 * 1024)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("│") for line in out.splitlines() if line.count("│") > 3]
    listed = {r[1].strip(): r[2].strip() for r in rows if r[1].strip() in made}
    assert listed == dict.fromkeys(made, "3.0M")
    assert "genai builds 3.0M, genai packages 3.0M, gguf loads 3.0M" in out
    assert main(["cache", "prune", "--keep", "0"]) == 0
    assert all(folder.is_dir() for folder in made.values())


def test_prune_keep_newest_per_variant_keeps_a_kept_packages_twin(cache):
    assert main(["cache", "prune", "--keep", "1"]) == 0
    assert _left(cache) == {"new32", "twin", "half", "draft"}


def test_prune_older_than(cache):
    assert main(["cache", "prune", "--older-than", "4"]) == 0
    assert _left(cache) == {"new32", "twin", "half", "draft"}  # twin: 5 days, half needs it


def test_prune_to_a_size_removes_oldest_first(cache):
    assert main(["cache", "prune", "--max-size", "14000"]) == 0
    # 22000 bytes: old32 (9 days) goes; then twin (5 days) would, but half needs it;
    # draft (3 days) goes next
    assert _left(cache) == {"new32", "twin", "half"}


def test_prune_dry_run_removes_nothing(cache, capsys):
    assert main(["cache", "prune", "--keep", "0", "--dry-run"]) == 0
    assert _left(cache) == set(cache)
    assert "would be freed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, field", [
    (["cache", "prune"], "--keep"),
    (["cache", "prune", "--max-size", "lots"], "--max-size"),
    (["cache", "prune", "--keep", "-1"], "--keep"),
    (["cache", "prune", "--older-than", "-2"], "--older-than"),
])
def test_prune_without_a_valid_rule_is_refused(cache, capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert field in err and "remedy:" in err and "Traceback" not in err
    assert _left(cache) == set(cache)


def _package(folder: Path, marker: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "package.yaml").write_text(f"name: {marker}\n")
    (folder / "target.onnx.data").write_bytes(b"\0" * 2048)
    return folder


def test_publishing_over_a_conversion_never_shows_half_a_package(tmp_path, monkeypatch):
    """The old folder is deleted only once the new one is in place."""
    import shutil as shutil_module

    from harness.convert import cache

    folder = _package(tmp_path / "pkg", "old")
    staged = _package(tmp_path / ".pkg.staged", "new")
    seen = []
    real_rmtree = shutil_module.rmtree

    def rmtree(path, *args, **kwargs):
        seen.append((folder / "package.yaml").read_text())  # what a reader finds now
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil_module, "rmtree", rmtree)
    cache.publish(staged, folder)
    assert seen == ["name: new\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_publishing_after_another_process_keeps_theirs(tmp_path, monkeypatch):
    from harness.convert import cache

    folder = tmp_path / "pkg"
    staged = _package(tmp_path / ".pkg.staged", "ours")
    real_rename = os.rename

    def rename(src, dst):  # another process publishes between our check and our rename
        if Path(src) == staged and not folder.exists():
            _package(folder, "theirs")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    cache.publish(staged, folder)
    assert (folder / "package.yaml").read_text() == "name: theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]
