"""Every top-level field of the files ``lockstep report`` reads (an evidence record, a run
manifest), mutated ten ways (issue 33's sweep): each mutation must be refused in one clear
line naming the file, the field and the value, or leave the file meaning what it meant.

The fields are the intact files' own (made once by a tiny in-process ``lockstep run``), so a
field added to ``EvidenceRecord`` or ``RunManifest`` is swept without a change here. A
mutation the loader takes is fine when the file then loads to the same record (deleting a
field that holds its default, null where null was written), or when ``ALLOWED`` gives the
reason it cannot change a conclusion; ``LEFT`` lists the takes still wrong.

First run (before the fixes of this commit), 412 cases: 77 taken. Among them, wrong
conclusions or misreadings: ``created`` deleted (now stood in) or a number (1970), manifest
``started`` a number, ``status`` and ``ok`` deleted or ``ok`` null (defaults stood in),
``numeric_scheme`` any text, ``engine_class`` any text, manifest ``run_id`` any text (''
included: its records lose their run).
"""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest

from suites.support import one_line_error

GONE = object()  # the field deleted
DEEP: object = 1
for _ in range(50):
    DEEP = [DEEP]


def mutations(value: object) -> dict[str, object]:
    """Ten ways to spoil a field holding ``value``."""
    wrong = (12345 if isinstance(value, str) else {"a": 1} if isinstance(value, list)
             else ["word"] if isinstance(value, dict) else "word")
    empty = [] if isinstance(value, list) else {} if isinstance(value, dict) else ""
    return {"deleted": GONE, "null": None, "wrong-type": wrong, "negative": -1, "zero": 0,
            "nan": math.nan, "huge": 1e308, "empty": empty, "word": "word", "deep": DEEP}


# (file, field) -> why any mutation the loader takes cannot change a conclusion
ALLOWED = {
    ("record", "run_id"): "a label grouping records; a run is found by its manifest's file",
    ("record", "engine"): "a name as typed (a plug-in engine's name cannot be checked here); "
                          "the record's verdict is its own",
    ("record", "engine_provenance"): "what the engine said it ran, shown, never judged",
    ("record", "reason"): "free text beside the status",
    ("record", "tokens_text"): "decoded pieces, shown, never judged",
    ("record", "timings"): "speed, never part of a verdict",
    ("record", "ledger"): "counters shown; the budgets judged from them are in budgets",
    ("record", "budgets"): "a passing check deleted shows as unchecked, never as passed; a "
                           "failing one deleted leaves status disagreeing (refused)",
    ("record", "verdicts"): "as budgets: a failed claim deleted leaves status disagreeing",
    ("manifest", "command"): "the command line, shown",
    ("manifest", "plan_digest"): "compared between shards only, whose own checks name it",
    ("manifest", "complete"): "deleted reads as incomplete: the run shows INCOMPLETE, never "
                              "green",
    ("manifest", "finished"): "a time shown; complete says whether the run ended",
    ("manifest", "planned"): "an empty plan: the records are each reported as found",
}

# (file, field, mutation) still taken wrongly: strict xfail, so a fix shows
LEFT = {
    # an identical record stripped of what judged it still reads identical; records built
    # in process (the suites' own) lack them too, so the rule needs its own change
    *(("record", field, how) for field in ("reference", "judgement", "logits_audit")
      for how in ("deleted", "null")),
}


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> Path:
    from harness.cli import main

    folder = tmp_path_factory.mktemp("intact") / "evidence"
    assert main(["run", "--packages", "tiny_llama", "--engines", "native-host",
                 "--max-new-tokens", "2", "--max-prompts", "1", "--evidence-dir",
                 str(folder)]) == 0
    return folder


def _files(folder: Path) -> dict[str, Path]:
    return {"record": next(folder.glob("*.json")), "manifest": next((folder / "runs").glob("*.json"))}


def _load(kind: str, path: Path) -> dict:
    from harness.evidence.store import read_evidence
    from harness.manifest import _validated
    from engines import json_text

    loaded = (read_evidence(path) if kind == "record"
              else _validated(json_text.loads(path.read_text()), path))
    return loaded.model_dump(mode="json")


def _cases() -> list[tuple[str, str, str]]:
    """(file, field, mutation) for every top-level field of both models, and one unknown
    field each; the fields are the models' (an intact file holds every one)."""
    from harness.evidence.schema import EvidenceRecord
    from harness.manifest import RunManifest

    out = []
    for kind, model in (("record", EvidenceRecord), ("manifest", RunManifest)):
        fields = [*model.model_fields, *model.model_computed_fields]
        out += [(kind, f, how) for f in fields for how in mutations("")]
        out.append((kind, "x_unknown", "extra"))
    return out


def _mutated(doc: dict, field: str, how: str) -> tuple[dict, object]:
    doc = copy.deepcopy(doc)
    value = 1 if how == "extra" else mutations(doc[field])[how]
    if value is GONE:
        del doc[field]
    else:
        doc[field] = value
    return doc, value


def _value_needle(value: object) -> str | None:
    """What the line must quote of a scalar written in place of the field's value."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value)
    return None


CASES = _cases()


@pytest.mark.parametrize("kind,field,how", [
    pytest.param(*c, id="-".join(c), marks=[pytest.mark.xfail(strict=True, reason="LEFT")]
                 if c in LEFT else []) for c in CASES])
def test_a_spoiled_field_is_refused_clearly_or_means_nothing(kind, field, how, intact,
                                                             tmp_path, capsys):
    folder = Path(shutil.copytree(intact, tmp_path / "evidence"))
    path = _files(folder)[kind]
    original = _load(kind, path)
    doc, value = _mutated(json.loads(path.read_text()), field, how)
    text = json.dumps(doc)
    path.write_text(text)
    try:
        taken = _load(kind, path)
    except Exception:  # noqa: BLE001  (refused: the CLI must say so in one clear line)
        taken = None
    if taken is not None:
        assert taken == original or (kind, field) in ALLOWED, \
            f"{kind} {field} {how}: taken, and it changes what the file says"
        return
    line = one_line_error(capsys, ["report", str(folder), "-o", str(tmp_path / "r.html")])
    needles = [path.name, field] + ([] if how == "deleted" else
                                     [n for n in [_value_needle(value)] if n])
    for needle in needles:
        assert needle in line, (needle, line)
    assert "remedy:" in line, line
    assert path.read_text() == text  # the user's file is as they left it
    assert not (tmp_path / "r.html").exists()


def test_allowed_and_left_name_real_cases():
    fields = {(k, f) for k, f, _ in CASES}
    assert set(ALLOWED) <= fields and LEFT <= set(CASES)


def test_a_status_deleted_from_an_unavailable_record_is_refused(intact, tmp_path, capsys):
    """Derived from findings a deleted status would read ``identical``: an unjudged cell
    shown as a pass. A file must hold what it concluded (and when: ``created``)."""
    folder = Path(shutil.copytree(intact, tmp_path / "evidence"))
    path = _files(folder)["record"]
    doc = json.loads(path.read_text())
    doc.update(status="unavailable", judgement=None)
    path.write_text(json.dumps(doc))
    assert _load("record", path)["status"] == "unavailable"
    del doc["status"]
    path.write_text(json.dumps(doc))
    line = one_line_error(capsys, ["report", str(folder), "-o", str(tmp_path / "r.html")])
    assert path.name in line and "status" in line and "remedy:" in line, line
