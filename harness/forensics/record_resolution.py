"""Which record, engine and package an explanation or a repro pack is about: a record read
from its path, its first failing step, the engine class it names and the package it ran on
(checked by content hash).
"""
from __future__ import annotations

from pathlib import Path

from engines import json_text
from engines.errors import EngineDefinitionError, InputError, LockstepError, UnknownEngine
from engines.package import Package
from engines.registry import check_engine_class, class_reference, get_engine_class
from harness.evidence import EvidenceError, evidence_files, read_evidence
from harness.evidence.other_outputs import other_output, the_remedy
from harness.evidence.schema import EvidenceRecord
from harness.evidence.store import SUFFIX
from harness.packages import resolve_package


def load_record(record_or_path) -> tuple:
    """(the record, the path it was read from or None) for a record or a path to one; a run
    manifest (``runs/<run_id>.json``, the cells a run planned) given instead is named as one,
    with a record of its folder to give, and a file that is neither JSON nor named ``.json``
    (a report, a log) as not a record at all, not as a record damaged."""
    if isinstance(record_or_path, EvidenceRecord):
        return record_or_path, None
    path = Path(record_or_path)
    try:
        return read_evidence(path), str(path)
    except EvidenceError:
        parsed = _parsed(path)
        if isinstance(parsed, dict) and {"run_id", "planned"} <= set(parsed):  # a manifest
            folder = path.parent.parent
            records = evidence_files(folder) if folder.is_dir() else []
            example = records[0] if records else folder / "<record>.json"
            raise InputError("this is a run manifest (the cells one run planned), not a "
                             "cell's record", field="EVIDENCE_FILE", value=str(path),
                             remedy=f"give one of the records beside its runs/ folder, such "
                                    f"as {example}") from None
        other = other_output(parsed)
        if other is not None:
            raise InputError(f"this is {other[0]}, not a cell's record", field="EVIDENCE_FILE",
                             value=str(path), remedy=the_remedy(other[1])) from None
        if path.suffix != SUFFIX and path.is_file() and parsed is _NOT_JSON:
            raise InputError("not a JSON evidence record", field="EVIDENCE_FILE",
                             value=str(path), remedy="give one <evidence>/<cell>.json record"
                             ) from None
        raise


_NOT_JSON = object()


def _parsed(path: Path):
    """The JSON a readable file holds, or ``_NOT_JSON``."""
    try:
        return json_text.loads(path.read_bytes())
    except (OSError, ValueError):
        return _NOT_JSON


def failing_step(record) -> tuple[int, str] | None:
    """The first step anything failing was found at in ``record``: a defect finding, a logits
    row out of tolerance or non-finite, an error's step; else a near-tie's step."""
    steps: list[tuple[int, str]] = []
    if record.divergence is not None and record.divergence.verdict == "defect":
        steps.append((record.divergence.step, "defect"))
    if record.judgement is not None:
        for f in record.judgement.findings:
            if f.verdict == "defect":
                steps.append((f.step, "defect"))
                break
    if record.logits_audit is not None:
        for s in record.logits_audit.steps:
            if s.non_finite:
                steps.append((s.step, "non-finite"))
                break
        for s in record.logits_audit.steps:
            if not s.ok and not s.non_finite:
                steps.append((s.step, "drift"))
                break
    if record.error is not None and record.error.step is not None:
        steps.append((record.error.step, "non-finite" if record.status == "non-finite"
                      else "error"))
    if steps:
        return min(steps)
    if record.divergence is not None:
        return record.divergence.step, record.divergence.verdict
    return None


def step_to_examine(record, verb: str, anyway: str = "") -> tuple[int, str]:
    """``failing_step`` of a record, or an ``InputError`` saying why there is nothing to
    ``verb`` (explain, reproduce) in it; ``anyway``: how the command is told to look at a step
    regardless (explain's --step; repro has none)."""
    found = failing_step(record)
    if found is not None:
        return found
    if record.error is not None:
        raise InputError(f"nothing to {verb}: the cell failed in its {record.error.stage} "
                         f"({record.error.type}), outside any forward", field="error.stage",
                         value=record.error.stage,
                         remedy=f"fix what the error names; {verb} needs a forward")
    if record.status == "budget":
        raise InputError(f"nothing to {verb}: a budget failure is about crossings, not "
                         "values (every token and logits row passed)", field="status",
                         value=record.status, remedy="see the record's budgets")
    raise InputError(f"nothing to {verb}: the record has no finding (no defect, no logits out "
                     "of tolerance, no error)", field="status", value=record.status,
                     remedy=f"{verb} a failing record{anyway}")


def steps_decided(record) -> int:
    """How many steps a forward of the record's engine decided: one per token it emitted,
    and the step whose forward raised."""
    count = len(record.tokens)
    if record.error is not None and record.error.step is not None:
        count = max(count, record.error.step + 1)
    return count


def resolve_engine_class(engine, record_engine: str, record_class: str | None = None):
    """An engine class from a class, an instance's class, a registered name or
    ``module:Class``; default: the record's engine class (``engine_class``, kept for an
    engine named by its class), else its engine by name. An engine other than the record's
    is refused."""
    if engine is None:
        try:
            return get_engine_class(record_class or record_engine)
        except (UnknownEngine, EngineDefinitionError) as err:
            where = (f"its class {record_class!r} cannot be loaded here ({err.message})"
                     if record_class else "is not registered here")
            raise InputError(f"the record's engine {record_engine!r} {where}",
                             field="--engine", value=record_class or record_engine,
                             remedy="name its class: --engine package.module:Class (for "
                                    "lockstep's planted bugs: suites.planted.engines:<Class>)"
                             ) from err
    if isinstance(engine, type):
        cls = engine
    elif isinstance(engine, str):
        cls = get_engine_class(engine)
    else:
        cls = check_engine_class(type(engine))
    if cls.name != record_engine:  # another engine's forward says nothing about this one's
        raise InputError(f"--engine is {cls.name!r}; the record was made by {record_engine!r}",
                         field="--engine", value=engine if isinstance(engine, str)
                         else class_ref(cls), remedy="name the record's own engine (its class: "
                                                     "--engine package.module:Class)")
    return cls


def resolve_record_package(record, package=None):
    """The package a record ran on: ``package`` (a Package, a folder or a fixture name),
    else the record's folder if it still holds the same content, else its name. A package
    whose content differs is named by what chose it: ``--package`` when the user gave one,
    else the record's ``package.content_hash``."""
    if isinstance(package, Package):
        pkg = package
    elif package is not None:
        try:
            pkg = resolve_package(package)
        except LockstepError as err:
            if err.field is None:  # the package as a whole: the option the user gave it by
                err.field, err.value = "package", str(package)
                err.args = (err.render(),)
            raise
    else:
        pkg = _record_package(record)
    want = record.package.content_hash
    if package is None and (pkg is None or pkg.content_hash != want):
        found = (f"{pkg.root} holds content hash {pkg.content_hash}" if pkg is not None else
                 f"no package named {record.package.name!r} or at "
                 f"{record.package.path or 'its path'} is here")
        raise InputError(f"the package the record ran on ({record.package.name!r}) is not "
                         f"here as it was: {found}", field="package.content_hash", value=want,
                         remedy="pass --package with the folder the record was made from, "
                                "as it was then")
    if pkg.content_hash != want:
        raise InputError(f"package {pkg.spec.name!r} here is not the package the record ran "
                         f"on (content hash {pkg.content_hash}, the record's {want})",
                         field="--package", value=str(pkg.root),
                         remedy="pass --package with the folder the record was made from")
    return pkg


def _record_package(record):
    """The record's folder if it still holds the same content, else the package of the
    record's name, else whichever of the two resolves; None when neither does."""
    refs = [record.package.path] if record.package.path and Path(
        record.package.path).is_dir() else []
    found = None
    for ref in [*refs, record.package.name]:
        try:
            pkg = resolve_package(ref)
        except Exception:  # a damaged or missing package: the record's hash is named instead
            continue
        if pkg.content_hash == record.package.content_hash:
            return pkg
        found = found or pkg
    return found


def class_ref(cls) -> str:
    """How to name ``cls`` again: its registered name for a built-in or entry point, else
    ``module:Class``."""
    return class_reference(cls) or cls.name


__all__ = ["class_ref", "failing_step", "load_record", "resolve_engine_class",
           "resolve_record_package", "step_to_examine", "steps_decided"]
