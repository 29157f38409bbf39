"""Every top-level field of the files lockstep reads (an evidence record and a run manifest,
through ``lockstep report``; a Hugging Face config.json, through the converter's reader),
mutated ten ways (issue 33's sweep): each mutation must be refused in one clear line naming
the file, the field and the value, or leave the file meaning what it meant.

The fields are the models' (``EvidenceRecord``, ``RunManifest``, ``hf_config.KINDS``), so a
field added to one is swept without a change here. A mutation the loader takes is fine when
the file then loads to the same record (deleting a field that holds its default, null where
null was written), or when ``ALLOWED`` gives the reason it cannot change a conclusion;
``LEFT`` lists the takes still wrong.

First run (main bc92085, before the fixes): records and manifests, 412 cases (321 of a
record): 15 taken wrongly: ``created`` deleted (now stood in) or a number (read as 1970),
manifest ``started`` a number, ``numeric_scheme`` and ``engine_class`` any text, manifest
``run_id`` any text ('' included: its records lose their run); and a ``status`` deleted from
an unavailable record read as identical (its own test below). config.json, 370 cases: 2
unclear, ``rms_norm_eps`` and ``rope_theta`` of 1e308 taken (inf as float32).
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

# (file, field, mutation) still taken wrongly; one refused fails the sweep, so a fix shows
LEFT = {
    # an identical record stripped of what judged it still reads identical; records built
    # in process (the suites' own) lack them too, so the rule needs its own change
    *(("record", field, how) for field in ("reference", "judgement", "logits_audit")
      for how in ("deleted", "null")),
}


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """One run's evidence folder, and its record and manifest as loaded."""
    from harness.cli import main

    folder = tmp_path_factory.mktemp("intact") / "evidence"
    assert main(["run", "--packages", "tiny_llama", "--engines", "native-host",
                 "--max-new-tokens", "2", "--max-prompts", "1", "--evidence-dir",
                 str(folder)]) == 0
    return folder, {kind: _load(kind, path) for kind, path in _files(folder).items()}


def _files(folder: Path) -> dict[str, Path]:
    return {"record": next(folder.glob("*.json")),
            "manifest": next((folder / "runs").glob("*.json"))}


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


def _spoiled_file_failure(kind: str, field: str, how: str, intact, tmp: Path,
                          capsys) -> str | None:
    """What is wrong with how ``report`` met this mutation (None: nothing)."""
    folder = Path(shutil.copytree(intact[0], tmp / "evidence"))
    path = _files(folder)[kind]
    original = intact[1][kind]
    doc, value = _mutated(json.loads(path.read_text()), field, how)
    text = json.dumps(doc)
    path.write_text(text)
    try:
        taken = _load(kind, path)
    except Exception:  # noqa: BLE001  (refused: the CLI must say so in one clear line)
        taken = None
    if taken is not None:
        if (kind, field, how) in LEFT or taken == original or (kind, field) in ALLOWED:
            return None
        return "taken, and it changes what the file says"
    if (kind, field, how) in LEFT:
        return "refused now: take it out of LEFT"
    try:
        line = one_line_error(capsys, ["report", str(folder), "-o", str(tmp / "r.html")])
    except AssertionError as err:
        return f"not one clear line: {str(err).splitlines()[0][:300]}"
    needles = [path.name, field] + ([] if how == "deleted" else
                                     [n for n in [_value_needle(value)] if n])
    missing = [n for n in needles if n not in line] + ([] if "remedy:" in line else ["remedy"])
    if missing:
        return f"the line lacks {missing}: {line}"
    if path.read_text() != text or (tmp / "r.html").exists():
        return "the user's file changed, or a report was written"
    return None


@pytest.mark.parametrize("kind,field", sorted({(k, f) for k, f, _ in CASES}))
def test_a_spoiled_field_is_refused_clearly_or_means_nothing(kind, field, intact, tmp_path,
                                                             capsys):
    failures = []
    for how in sorted({h for k, f, h in CASES if (k, f) == (kind, field)}):
        (tmp_path / how).mkdir()
        why = _spoiled_file_failure(kind, field, how, intact, tmp_path / how, capsys)
        if why:
            failures.append(f"{kind} {field} {how}: {why}")
    assert not failures, "\n".join(failures)


def test_allowed_and_left_name_real_cases():
    fields = {(k, f) for k, f, _ in CASES}
    assert set(ALLOWED) <= fields and LEFT <= set(CASES)


def test_a_status_deleted_from_an_unavailable_record_is_refused(intact, tmp_path, capsys):
    """Derived from findings a deleted status would read ``identical``: an unjudged cell
    shown as a pass. A file must hold what it concluded (and when: ``created``)."""
    folder = Path(shutil.copytree(intact[0], tmp_path / "evidence"))
    path = _files(folder)["record"]
    doc = json.loads(path.read_text())
    doc.update(status="unavailable", judgement=None)
    path.write_text(json.dumps(doc))
    assert _load("record", path)["status"] == "unavailable"
    del doc["status"]
    path.write_text(json.dumps(doc))
    line = one_line_error(capsys, ["report", str(folder), "-o", str(tmp_path / "r.html")])
    assert path.name in line and "status" in line and "remedy:" in line, line


# -- a Hugging Face config.json: every field the converter reads (hf_config.KINDS) ----------

# field -> why a value check_values takes cannot build a different model
ALLOWED_CONFIG = {
    "model_type": "read only where architectures is absent (hf_reader), and architectures "
                  "is checked",
    "bos_token_id": "0 is a token id like any other (below vocab_size, checked)",
    "eos_token_id": "0 is a token id like any other (below vocab_size, checked)",
}


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    pytest.importorskip("safetensors", reason="the converter needs the 'real' extra")
    from suites.convert_support import write_tiny_hf

    return write_tiny_hf(tmp_path_factory.mktemp("hf") / "hf")


@pytest.mark.parametrize("field", sorted(__import__("harness.convert.hf_config",
                                                     fromlist=["KINDS"]).KINDS))
def test_a_spoiled_config_field_is_refused_or_read_as_its_default(field, tiny_hf, tmp_path,
                                                                  capsys):
    """Refused by ``check_values`` naming the field, the value and the remedy; taken only as
    transformers reads it (deleted or null: the default, for a field that may be), or by a
    reason in ``ALLOWED_CONFIG``; else the conversion itself must refuse it in one line."""
    failures = []
    for how in mutations(""):
        (tmp_path / how).mkdir()
        why = _spoiled_config_failure(field, how, tiny_hf, tmp_path / how, capsys)
        if why:
            failures.append(f"config.json {field} {how}: {why}")
    assert not failures, "\n".join(failures)


def _spoiled_config_failure(field: str, how: str, tiny_hf: Path, tmp: Path, capsys
                            ) -> str | None:
    from engines.errors import LockstepError
    from harness.convert.hf_config import KINDS, check_values

    config = json.loads((tiny_hf / "config.json").read_text())
    config, value = _mutated({field: 1, **config}, field, how)
    try:
        check_values(config, "config.json")
    except LockstepError as err:
        same = how == "deleted" or err.value == value or (isinstance(value, float)
                                                          and math.isnan(value))
        return None if err.field == field and err.remedy and same else f"unclear: {err}"
    if how == "deleted" or (how == "null" and KINDS[field].nullable) or field in ALLOWED_CONFIG:
        return None
    folder = Path(shutil.copytree(tiny_hf, tmp / "hf"))
    (folder / "config.json").write_text(json.dumps(config))
    try:
        line = one_line_error(capsys, ["convert", str(folder), "-o", str(tmp / "out")])
    except AssertionError as err:
        return f"not one clear line: {str(err).splitlines()[0][:300]}"
    needles = [field, "remedy:"] + [n for n in [_value_needle(value)] if n]
    return None if all(n in line for n in needles) else f"the line lacks {needles}: {line}"
