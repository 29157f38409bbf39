"""Evidence records: schema round trip, strict reading, atomic and collision-free writing."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.errors import LockstepError
from engines.ledger import Ledger
from harness import evidence as ev
from harness.evidence import store


def make_record(*, package="tiny_llama", engine="native-host", mode=("greedy", None),
                prompt="p0", tokens=(5, 9, 12, 7, 30, 2), reference=None, margins=None,
                divergence=None, budgets=(), verdicts=None, tokens_text=None,
                reference_text=None, tokens_per_s=100.0, acceptance=(), memory=(),
                ledger=None, run_id="run-1") -> ev.EvidenceRecord:
    """A valid record with the digests computed; tests override what they plant."""
    tokens = list(tokens)
    reference = list(tokens if reference is None else reference)
    if margins is None:
        margins = [0.5 + 0.1 * i for i in range(len(reference))]
    return ev.EvidenceRecord(
        run_id=run_id,
        environment=ev.Environment(host="ci-host", platform="Linux", python="3.11.7",
                                   numpy="2.4.6"),
        package=ev.PackageRef(name=package, content_hash="sha256:" + "ab" * 32,
                              path=f"/pk/{package}"),
        engine=engine, mode=ev.Mode(kind=mode[0], width=mode[1]),
        prompt=ev.PromptRef(name=prompt, ids=[1, 17, 42]),
        tokens=tokens, tokens_text=tokens_text, token_digest=ev.token_digest(tokens),
        reference=ev.ReferenceRef(engine="oracle:ort-cpu", tokens=reference,
                                  digest=ev.token_digest(reference), margins=list(margins),
                                  tokens_text=reference_text),
        divergence=divergence, ledger=ledger if ledger is not None else Ledger(),
        memory_series=[ev.MemorySample(iteration=i, live_allocations=a, free_bytes=f)
                       for i, (a, f) in enumerate(memory)],
        acceptance_per_round=list(acceptance),
        timings=ev.Timings(wall_s=0.25, tokens_per_s=tokens_per_s,
                           phase_seconds={"prefill": 0.05, "decode": 0.2}),
        budgets=list(budgets),
        verdicts=dict(verdicts) if verdicts is not None else {"token_identity": "pass"},
    )


def rich_record() -> ev.EvidenceRecord:
    ledger = Ledger()
    ledger.record_readback("token_id", 24)
    ledger.record_forward("decode", 1, 0.01)
    ledger.slot("PRIMARY").captures = 1
    ledger.slot("PRIMARY").replays = 5
    return make_record(
        engine="native-cuda", mode=("draft", 3), tokens=[5, 9, 13, 7], reference=[5, 9, 12, 7],
        margins=[1.0, 0.8, float("inf"), 0.2],
        divergence=ev.Divergence(step=2, reference_token=12, engine_token=13, margin=0.004,
                                 verdict="near-tie"),
        budgets=[ev.BudgetCheck(claim="readback_budget", budget=16, measured=24, unit="bytes",
                                verdict="fail")],
        verdicts={"token_identity": "pass", "readback_budget": "fail", "graph_replay": "skip"},
        tokens_text=["a", " b", "\n", "é"], acceptance=[3, 1, 2],
        memory=[(10, 2**30), (10, 2**30 - 4096)], ledger=ledger)


# -- schema --------------------------------------------------------------------------------

def test_round_trip_through_a_file_preserves_every_field(tmp_path):
    record = rich_record()
    path = ev.write_evidence(record, tmp_path)
    again = ev.read_evidence(path)
    assert again == record
    assert again.reference.margins[2] == float("inf")  # survives JSON as "Infinity"
    assert again.ledger.graph_slots["PRIMARY"].replays == 5
    assert again.created.utcoffset().total_seconds() == 0
    on_disk = json.loads(path.read_text())
    assert on_disk["schema_version"] == ev.SCHEMA_VERSION == 2 and on_disk["ok"] is False


@given(st.lists(st.integers(min_value=-2**31, max_value=2**31 - 1), max_size=40))
def test_token_digest_is_sha256_of_little_endian_int32(ids):
    import hashlib

    expected = hashlib.sha256(b"".join(i.to_bytes(4, "little", signed=True) for i in ids))
    assert ev.token_digest(ids) == expected.hexdigest()
    assert ev.token_digest(np.asarray(ids, dtype=np.int64)) == expected.hexdigest()


def test_token_digest_rejects_ids_outside_int32():
    with pytest.raises(ValueError, match="int32"):
        ev.token_digest([2**31])


def test_ok_reflects_defects_budgets_and_claims():
    assert make_record().ok
    for status in ("error", "non-finite", "defect", "budget", "drift"):
        assert not make_record().model_copy(update={"status": status}).ok, status
    for status in ("near-tie", "unavailable"):
        assert make_record().model_copy(update={"status": status}).ok, status
    tie = ev.Divergence(step=1, reference_token=9, engine_token=8, margin=1e-4, verdict="near-tie")
    assert make_record(tokens=[5, 8], reference=[5, 9], divergence=tie).ok
    defect = tie.model_copy(update={"verdict": "defect"})
    assert not make_record(tokens=[5, 8], reference=[5, 9], divergence=defect).ok
    breach = ev.BudgetCheck(claim="zero_staging", budget=0, measured=1, verdict="fail")
    assert not make_record(budgets=[breach]).ok
    assert not make_record(verdicts={"flat_memory": "fail"}).ok
    assert make_record(verdicts={"flat_memory": "skip"}).ok


def test_ledger_record_mirrors_the_ledger_dataclass():
    assert set(ev.LedgerRecord.model_fields) == {f.name for f in fields(Ledger)}
    ledger = Ledger()
    ledger.record_staging(64, "argmax fallback")
    ledger.slot("VERIFY").fallbacks = 2
    record = make_record(ledger=ledger)
    assert record.ledger.model_dump() == ledger.to_dict()


@pytest.mark.parametrize("kind,width", [("greedy", 2), ("draft", None), ("mtp", 0)])
def test_mode_width_must_match_its_kind(kind, width):
    with pytest.raises(ValueError, match="width"):
        ev.Mode(kind=kind, width=width)


def test_json_schema_describes_the_written_file():
    schema = ev.evidence_json_schema()
    assert schema["properties"]["schema_version"]["const"] == ev.SCHEMA_VERSION
    written = json.loads(rich_record().model_dump_json())
    assert set(written) == set(schema["properties"])
    assert set(schema["required"]) <= set(written)
    assert "ok" in schema["required"]


def test_environment_collects_without_a_gpu_and_names_versions():
    env = ev.collect_environment()
    assert env.python and env.host
    assert env.numpy == np.__version__
    commit = env.git_commit
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert env.cupy is None and env.gpu_name is None


def _git(cwd: Path, *args: str) -> str:
    import subprocess  # noqa: PLC0415
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    return done.stdout.strip()


def _commit_repo(path: Path) -> str:
    """A git repository at ``path`` with one commit; its HEAD."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    (path / "f.txt").write_text("x")
    _git(path, "add", "f.txt")
    _git(path, "commit", "-q", "-m", "c")
    return _git(path, "rev-parse", "HEAD")


def test_environment_records_lockstep_commit_when_set(monkeypatch):
    pinned = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("LOCKSTEP_COMMIT", pinned)
    assert ev.collect_environment().git_commit == pinned
    assert ev.git_commit() == pinned


def test_environment_commit_is_not_an_enclosing_checkouts_head(tmp_path, monkeypatch):
    """A snapshot without .git nested in another checkout: git would answer with the enclosing
    repository's HEAD, a different commit; that is recorded as unknown."""
    from harness.evidence import environment  # noqa: PLC0415
    monkeypatch.delenv("LOCKSTEP_COMMIT", raising=False)
    outer_head = _commit_repo(tmp_path / "outer")
    snapshot = tmp_path / "outer" / "work" / "lockstep"
    snapshot.mkdir(parents=True)
    monkeypatch.setattr(environment, "_REPO_ROOT", snapshot)
    assert ev.collect_environment().git_commit is None
    assert ev.git_commit(snapshot) is None
    assert ev.git_commit(tmp_path / "outer") == outer_head  # its own top level: its HEAD


def test_environment_commit_says_dirty_where_tracked_files_changed(tmp_path, monkeypatch):
    """A work tree whose tracked files differ from HEAD (a copied tree whose .git names
    another commit than the code it holds) records HEAD with -dirty; an untracked file
    alone (evidence written into the tree) does not make it dirty."""
    monkeypatch.delenv("LOCKSTEP_COMMIT", raising=False)
    repo = tmp_path / "repo"
    head = _commit_repo(repo)
    (repo / "notes.txt").write_text("untracked")
    assert ev.git_commit(repo) == head
    (repo / "f.txt").write_text("changed")
    assert ev.git_commit(repo) == head + "-dirty"
    _git(repo, "checkout", "-q", "--", "f.txt")
    assert ev.git_commit(repo) == head


def test_environment_commit_empty_lockstep_commit_falls_back_to_git(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_COMMIT", "  ")
    head = _commit_repo(tmp_path / "repo")
    assert ev.git_commit(tmp_path / "repo") == head
    assert ev.git_commit(tmp_path) is None  # not a repository at all


def test_environment_names_the_imported_onnxruntime_not_a_shadowed_distribution(monkeypatch):
    """onnxruntime and onnxruntime-gpu both installed, one shadowing the other on sys.path:
    the version recorded is that of the module imported, whatever the metadata says."""
    ort = pytest.importorskip("onnxruntime")
    import onnx  # noqa: PLC0415
    from harness.evidence import environment  # noqa: PLC0415
    monkeypatch.setattr(environment.metadata, "version", lambda name: "0.0.0-wrong")
    env = ev.collect_environment()
    assert env.onnxruntime == ort.__version__
    assert env.onnx == onnx.__version__
    assert env.numpy == np.__version__


# -- strict reading ------------------------------------------------------------------------

def _written(tmp_path) -> tuple[Path, str]:
    path = ev.write_evidence(rich_record(), tmp_path)
    return path, path.read_text()


def _error_for(path: Path) -> ev.EvidenceError:
    with pytest.raises(ev.EvidenceError) as info:
        ev.read_evidence(path)
    assert isinstance(info.value, LockstepError)
    assert str(path) in str(info.value)
    return info.value


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.999])
def test_partial_file_names_itself(tmp_path, cut):
    path, text = _written(tmp_path)
    path.write_text(text[:int(len(text) * cut)])
    err = _error_for(path)
    assert "partial" in err.remedy or "truncated" in err.message


def test_corrupted_bytes_name_the_file(tmp_path):
    path, text = _written(tmp_path)
    path.write_bytes(text.encode()[:40] + b"\xff\xfe" + text.encode()[40:])
    assert "UTF-8" in _error_for(path).message


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(schema_version=1), "schema_version"),
    (lambda d: d.pop("schema_version"), "schema_version"),
    (lambda d: d["mode"].update(kind="beam"), "mode.kind"),
    (lambda d: d.update(tokens=[5, 9, 13, 8]), "token_digest"),
    (lambda d: d["reference"].update(tokens=[5]), "reference.digest"),
    (lambda d: d.update(ok=True), "ok"),
    (lambda d: d.update(surprise=1), "surprise"),
    (lambda d: d["budgets"][0].update(verdict="maybe"), "budgets.0.verdict"),
    (lambda d: d.update(created="2026-01-01T00:00:00+02:00"), "created"),
    (lambda d: d.update(created="2999-01-01T00:00:00Z"), "created"),
    (lambda d: d.update(status="identical"), "status"),
    (lambda d: d["verdicts"].update(made_up_claim="pass"), "verdicts.made_up_claim"),
])
def test_wrong_schema_names_file_and_field(tmp_path, edit, field):
    path, text = _written(tmp_path)
    data = json.loads(text)
    edit(data)
    path.write_text(json.dumps(data))
    err = _error_for(path)
    assert err.field is not None and err.field.startswith(field), err


def test_top_level_not_an_object(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[1, 2]")
    assert "object" in _error_for(path).message


def test_load_dir_reports_the_bad_file_among_good_ones(tmp_path):
    good = [ev.write_evidence(make_record(prompt=f"p{i}"), tmp_path) for i in range(3)]
    bad = tmp_path / "zz-bad.json"
    bad.write_text('{"schema_version": 1, "run_id": ')
    with pytest.raises(ev.EvidenceError) as info:
        ev.load_evidence_dir(tmp_path)
    assert info.value.where == str(bad)
    bad.unlink()
    assert sorted(r.prompt.name for r in ev.load_evidence_dir(tmp_path)) == ["p0", "p1", "p2"]
    assert len(good) == 3


def test_load_dir_missing_or_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ev.EvidenceError, match="does not exist"):
        ev.load_evidence_dir(tmp_path / "nope")
    with pytest.raises(ev.EvidenceError, match="no evidence files"):
        ev.load_evidence_dir(tmp_path)
    assert ev.load_evidence_dir(tmp_path, allow_empty=True) == []


def judged_record(defects: int, near_ties: int = 0, **kw) -> ev.EvidenceRecord:
    """A record whose judgement lists ``defects`` defect and ``near_ties`` near-tie steps."""
    findings = [ev.StepFinding(step=i, engine_token=7, oracle_token=8, rank=3, gap=0.9,
                               verdict="defect" if i < defects else "near-tie", reason="planted")
                for i in range(defects + near_ties)]
    judgement = ev.Judgement(oracle="oracle:ort-cpu", near_tie_margin=0.01, steps_judged=6,
                             defects=defects, near_ties=near_ties, findings=findings)
    return make_record().model_copy(update={"judgement": judgement, **kw})


def _refusal(tmp_path, edit) -> ev.EvidenceError:
    path, text = _written(tmp_path)
    data = json.loads(text)
    edit(data)
    data.pop("ok")  # an editor who knows ``ok`` is recomputed
    path.write_text(json.dumps(data))
    return _error_for(path)


def test_a_status_that_contradicts_the_judgement_is_refused_naming_both_values(tmp_path):
    held = json.loads(judged_record(29).model_dump_json())["judgement"]
    err = _refusal(tmp_path, lambda d: d.update(judgement=held, status="identical",
                                                 budgets=[], verdicts={}, divergence=None))
    assert err.field == "status"
    assert "'identical'" in err.message and "'defect'" in err.message
    assert "29 defect step(s)" in err.message
    assert len(err.render().splitlines()) == 1


@pytest.mark.parametrize("written", ["error", "defect", "budget", "near-tie"])
def test_a_status_worse_than_what_the_record_holds_is_refused_too(tmp_path, written):
    err = _refusal(tmp_path, lambda d: d.update(status=written, budgets=[], verdicts={},
                                                 divergence=None))
    assert err.field == "status" and repr(written) in err.message and "'identical'" in err.message


def test_status_is_derived_where_a_writer_leaves_it_out_and_kept_where_it_agrees(tmp_path):
    assert rich_record().status == "budget"  # a failed budget over a near-tie divergence
    for defects, near_ties, status in ((3, 1, "defect"), (0, 2, "near-tie")):
        data = judged_record(defects, near_ties).model_dump(exclude={"status", "ok"})
        assert ev.EvidenceRecord.model_validate(data).status == status
    unavailable = make_record().model_dump(exclude={"status"}) | {"status": "unavailable"}
    assert ev.EvidenceRecord.model_validate(unavailable).status == "unavailable"
    path = ev.write_evidence(judged_record(2, status="defect"), tmp_path)
    assert ev.read_evidence(path).status == "defect"


def test_derived_status_follows_the_judges_severity_order():
    from harness.judgement import worst

    audit = ev.LogitsAuditRecord(dtype="float32", tolerance={}, decode="same", steps=[],
                                 non_finite_steps=1, out_of_tolerance_steps=2)
    error = ev.ErrorInfo(stage="decode", type="NonFiniteLogits", message="all NaN")
    record = judged_record(4).model_copy(update={"logits_audit": audit})
    assert ev.found_status(record)[0] == worst("defect", "non-finite", "drift") == "non-finite"
    assert ev.found_status(record.model_copy(update={"error": error}))[0] == "non-finite"
    other = error.model_copy(update={"type": "ExecutionError"})
    assert ev.found_status(record.model_copy(update={"error": other}))[0] == "error"
    assert ev.found_status(make_record(verdicts={"finite_logits": "fail"}))[0] == "non-finite"
    assert ev.found_status(make_record(verdicts={"graph_replay": "fail"}))[0] == "budget"


def test_judgement_counts_must_match_its_findings(tmp_path):
    held = json.loads(judged_record(2).model_dump_json())["judgement"]
    held["defects"] = 29
    err = _refusal(tmp_path, lambda d: d.update(judgement=held, status="defect"))
    assert err.field == "judgement.defects" and "29" in err.message and "2 defect" in err.message


def test_a_record_dated_in_the_future_is_refused_but_clock_skew_is_not(tmp_path):
    from datetime import timedelta

    err = _refusal(tmp_path, lambda d: d.update(created="2999-01-01T00:00:00Z"))
    assert err.field == "created" and "2999" in err.message and "future" in err.message
    soon = (ev.schema.utc_now() + timedelta(minutes=2)).isoformat()
    path, text = _written(tmp_path / "skew")
    path.write_text(text.replace(json.loads(text)["created"], soon))
    assert ev.read_evidence(path).created.isoformat() == soon


# -- atomic, collision-free writing --------------------------------------------------------

def test_crash_mid_write_leaves_no_target_and_no_temp(tmp_path, monkeypatch):
    def crash(fd):
        raise OSError(5, "simulated power loss during fsync")

    monkeypatch.setattr(store.os, "fsync", crash)
    with pytest.raises(OSError, match="simulated"):
        ev.write_evidence(rich_record(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_crash_before_rename_leaves_only_a_hidden_temp_that_readers_skip(tmp_path, monkeypatch):
    # A SIGKILL between write and rename cannot run cleanup: emulate it by skipping the
    # rename and the unlink. The visible folder must still hold only whole records.
    ev.write_evidence(make_record(prompt="whole"), tmp_path)
    monkeypatch.setattr(store.os, "replace", lambda *a: (_ for _ in ()).throw(SystemExit(9)))
    monkeypatch.setattr(store.os, "unlink", lambda *a: None)
    with pytest.raises(SystemExit):
        ev.write_evidence(make_record(prompt="killed"), tmp_path)
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].suffix == ".tmp"
    assert [r.prompt.name for r in ev.load_evidence_dir(tmp_path)] == ["whole"]


def test_parallel_threads_never_collide(tmp_path):
    record = make_record()  # identical records: only the uuid fragment separates them
    paths: list[Path] = []
    lock = threading.Lock()

    def worker():
        for _ in range(25):
            p = ev.write_evidence(record, tmp_path)
            with lock:
                paths.append(p)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == len(set(paths)) == 200
    assert len(ev.load_evidence_dir(tmp_path)) == 200
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _write_from_process(folder: str, n: int) -> list[str]:
    return [str(ev.write_evidence(make_record(), folder)) for _ in range(n)]


def test_parallel_processes_never_collide(tmp_path):
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(_write_from_process, [str(tmp_path)] * 4, [10] * 4))
    names = [p for chunk in results for p in chunk]
    assert len(set(names)) == 40
    assert len(ev.load_evidence_dir(tmp_path)) == 40


def test_file_name_is_safe_and_names_the_cell(tmp_path):
    record = make_record(package="../etc/pass wd", engine="a/b", mode=("draft", 4), prompt="x y")
    path = ev.write_evidence(record, tmp_path)
    assert path.parent == tmp_path
    assert "draft-w4" in path.name and "a-b" in path.name and "/" not in path.name
    assert os.path.commonpath([path.resolve(), tmp_path.resolve()]) == str(tmp_path.resolve())
