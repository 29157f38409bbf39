"""The evidence record: one JSON file per (package, engine, mode, prompt) cell of a run.

Versioned (``schema_version``) so a report can refuse a file it would misread, and strict
(unknown fields are errors) so a typo in a writer fails at the writer, not in a report
months later. The digests are checked on load: a record whose tokens do not hash to its
digest was edited or truncated.
"""
from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal

import numpy as np
from pydantic_core import PydanticCustomError
from pydantic import (AwareDatetime, BaseModel, ConfigDict, Field, ValidationInfo,
                      computed_field, field_validator, model_validator)

from engines.errors import NonFiniteLogits
from engines.ledger import Ledger
from harness.claims import CLAIM_IDS, CLAIMS as CLAIM_REGISTRY
from harness.judgement import (BUDGET, DEFECT, DRIFT, ERROR, FAILING, IDENTICAL, NEAR_TIE,
                               NON_FINITE, UNAVAILABLE, Status, StepVerdict, worst)

# 2: every cell has a record (status, error), every step judged (judgement), the logits
# audit, the greedy stream of a speculative cell, claims from harness.claims
SCHEMA_VERSION = 2

CLAIMS = CLAIM_IDS
Claim = Literal[CLAIM_IDS]  # type: ignore[valid-type]
Verdict = Literal["pass", "fail", "skip"]
ModeKind = Literal["greedy", "draft", "chained", "mtp", "prompt-lookup"]
# how far ahead of this machine's clock a record's ``created`` may be (another machine of a
# sharded run, a clock a little fast); anything later was not written by a run
CLOCK_SKEW = timedelta(minutes=10)
# no run wrote a time before lockstep existed: an earlier one (a timestamp of 0 or -1, read
# as 1970) is an edit, and would sort the record or manifest as the oldest of its folder
EARLIEST = datetime(2024, 1, 1, tzinfo=timezone.utc)
# fields a file lockstep wrote always holds, though a record built in process may leave them
# to their defaults: read from a file, a default (now; the status derived from findings, which
# cannot show ``unavailable``) would stand in for what the file said. ``ok`` may be left out:
# it is recomputed whatever the file says
WRITTEN = ("created", "status")
FROM_FILE = {"file": True}  # the validation context of a record read from a file
# Engine.numeric_scheme()'s form: the backend, a colon, its scheme ("ggml-cpu:q4_0")
NUMERIC_SCHEME = r"^[a-z0-9][a-z0-9_.-]*:[A-Za-z0-9][A-Za-z0-9_.-]*$"


Count = Annotated[int, Field(ge=0)]  # a ledger counter: how many, or how many bytes
CONTENT_HASH = r"^sha256:[0-9a-f]{64}$"  # engines.package.package_content_hash's form


def token_digest(ids: list[int] | np.ndarray) -> str:
    """sha256 of the ids as little-endian int32: the same stream hashes the same everywhere."""
    arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        raise ValueError("token ids must fit in int32")
    return hashlib.sha256(arr.astype("<i4", copy=False).tobytes()).hexdigest()


def _inconsistent(field: str, message: str) -> PydanticCustomError:
    """A record-level error that still names the field it is about (``ctx['field']``)."""
    return PydanticCustomError("evidence_inconsistent", message.replace("{", "(").replace("}", ")"),
                               {"field": field})


def run_time(value: datetime, name: str) -> datetime:
    """``value`` as a time a run can have written (``created``, ``started``, ``finished``):
    not before ``EARLIEST``, not ahead of this machine's clock by more than ``CLOCK_SKEW``."""
    now = utc_now()
    if value < EARLIEST:
        raise ValueError(f"{name} {value.isoformat()} is before {EARLIEST.date()}, when no "
                         f"lockstep run existed")
    if value > now + CLOCK_SKEW:
        raise ValueError(f"{name} {value.isoformat()} is in the future (now "
                         f"{now.isoformat(timespec='seconds')}, {CLOCK_SKEW} of clock "
                         f"skew allowed): no run wrote it")
    return value


def new_run_id() -> str:
    """A run id that sorts by time and is unique across machines: UTC stamp + 8 hex."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class _Strict(BaseModel):
    # Infinity/NaN are written as strings ("Infinity") so files stay standard JSON and
    # still round-trip: an infinite margin (the reference stopped) must not become null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class Environment(_Strict):
    """Where the evidence was produced; None where not applicable (no GPU, no git)."""
    host: str
    platform: str
    python: str
    numpy: str | None = None
    onnx: str | None = None
    onnxruntime: str | None = None
    cupy: str | None = None
    cuda_runtime: str | None = None
    cuda_driver: str | None = None
    gpu_name: str | None = None
    gpu_memory_bytes: int | None = None
    # which GPU: its index as nvidia-smi numbers it (the one a pytest-xdist worker was pinned
    # to), and its UUID as nvidia-smi prints it ("GPU-xxxxxxxx-..."), the identity that tells
    # two GPUs of one host apart (their device properties may show the same PCI bus id)
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    git_commit: str | None = None


class PackageRef(_Strict):
    name: str
    content_hash: str = Field(pattern=CONTENT_HASH)
    path: str | None = None


class Mode(_Strict):
    """greedy has no width; every speculative kind has a width >= 1."""
    kind: ModeKind
    width: int | None = None

    @model_validator(mode="after")
    def _width_matches_kind(self) -> "Mode":
        if self.kind == "greedy" and self.width is not None:
            raise ValueError(f"greedy mode takes no width (got {self.width}); use width=None")
        if self.kind != "greedy" and (self.width is None or self.width < 1):
            raise ValueError(f"{self.kind} mode needs a width >= 1 (got {self.width})")
        return self

    @property
    def label(self) -> str:
        return self.kind if self.width is None else f"{self.kind}/w{self.width}"


class ChatMessage(_Strict):
    role: str
    content: str


class PromptRef(_Strict):
    """The prompt's ids and what they were made from (``harness.prompts``): given as ids, as
    text (``source_text``, encoded by the package's tokenizer) or as a chat (``messages``
    rendered by ``chat_template``, the checkpoint's own, into ``source_text``)."""
    name: str
    ids: list[int] = Field(min_length=1)  # lockstep refuses an empty prompt before any cell
    text: str | None = None  # the ids decoded, where the package has a tokenizer
    source: Literal["ids", "text", "chat"] = "ids"
    source_text: str | None = None
    messages: list[ChatMessage] | None = None
    chat_template: str | None = None


class ReferenceRef(_Strict):
    """The stream the engine is compared with (the oracle, or greedy for a speculative mode)."""
    engine: str
    tokens: list[int]
    digest: str
    margins: list[float] = Field(default_factory=list)
    tokens_text: list[str] | None = None  # decoded pieces, where a tokenizer exists

    @model_validator(mode="after")
    def _digest_matches(self) -> "ReferenceRef":
        expected = token_digest(self.tokens)
        if self.digest != expected:
            raise _inconsistent("reference.digest",
                                f"reference digest {self.digest!r} does not match its tokens "
                                f"(sha256 of int32 ids is {expected!r})")
        if self.tokens_text is not None and len(self.tokens_text) != len(self.tokens):
            raise _inconsistent("reference.tokens_text",
                                f"reference tokens_text has {len(self.tokens_text)} entries "
                                f"for {len(self.tokens)} tokens")
        return self


class Divergence(_Strict):
    """The first finding of the judgement (first defect, else first near-tie): the step,
    the engine's token and the oracle's argmax on the engine's own prefix."""
    step: int = Field(ge=0)
    reference_token: int | None
    engine_token: int | None  # None: the engine's stream ended before this step
    margin: float | None = None  # the oracle's top-2 logit margin at ``step``
    verdict: StepVerdict
    rank: int | None = None  # rank of the engine's token in the oracle's row (1 = argmax)
    gap: float | None = None  # oracle best minus the oracle logit of the engine's token
    reason: str | None = None


class StepFinding(_Strict):
    """A judged step that is not a plain match (claim 1), with both top-5 lists."""
    step: int = Field(ge=0)
    engine_token: int | None
    oracle_token: int | None
    rank: int | None = None
    gap: float | None = None
    verdict: StepVerdict
    reason: str
    oracle_top: list[tuple[int, float]] = Field(default_factory=list)
    engine_top: list[tuple[int, float]] | None = None


class OracleCheck(_Strict):
    """An oracle moved to another engine (``--oracle-engine``) and how it agreed with the
    default oracle's on a short prefix before the run (``harness.oracle_choice``)."""
    engine: str
    against: str
    prefix_tokens: int = Field(ge=1)
    steps: int = Field(ge=0)
    max_abs: float
    nmse: float


class Judgement(_Strict):
    """Claim 1 over the whole stream: every step judged on the engine's own prefix."""
    oracle: str  # the engine the oracle ran on
    # how its rows were computed (engines.oracle): one forward per stream, or per prefix;
    # None in records written before the modes existed (per prefix)
    oracle_mode: Literal["stream", "recompute"] | None = None
    # the package the oracle ran: the judged package itself, or its float32 twin (reference)
    oracle_package: PackageRef | None = None
    oracle_check: OracleCheck | None = None  # only where the oracle was moved and vetted
    near_tie_margin: float
    steps_judged: int = Field(ge=0)
    defects: int = Field(ge=0)
    near_ties: int = Field(ge=0)
    findings: list[StepFinding] = Field(default_factory=list)

    @model_validator(mode="after")
    def _counts_match_findings(self) -> "Judgement":
        for name, written, verdict in (("defects", self.defects, DEFECT),
                                       ("near_ties", self.near_ties, NEAR_TIE)):
            listed = sum(f.verdict == verdict for f in self.findings)
            if written != listed:
                raise _inconsistent(f"judgement.{name}",
                                    f"judgement.{name} is written as {written} but its "
                                    f"findings list {listed} {verdict} step(s)")
        return self


class StepAuditRecord(_Strict):
    step: int = Field(ge=0)
    max_abs: float | None = None  # None where the row is not finite
    max_rel: float | None = None
    nmse: float | None = None
    non_finite: int = Field(ge=0)
    ok: bool
    where: str | None = None  # a speculative decode's forward and row ("verify r3 row 1")
    finding: str | None = None  # a top-k audit: what failed at this step, in words
    kl: float | None = None  # KL(oracle || engine) of the rows' softmaxes, nats


class LogitsAuditRecord(_Strict):
    """Claim 1b: each step's logits against the oracle's row on the same prefix, by the
    dtype's tolerance row. ``decode`` says how the rows were taken: in the judged decode
    (``same``, host engines) or in a separate, labelled audit decode (``separate``, device
    engines: its readbacks are counted under ``logits_audit``, never in a budget)."""
    dtype: str
    tolerance: dict[str, float]
    decode: Literal["same", "separate"]
    steps: list[StepAuditRecord]
    non_finite_steps: int = Field(ge=0)
    out_of_tolerance_steps: int = Field(ge=0)
    worst_max_abs: float | None = None
    worst_nmse: float | None = None
    readback_bytes: int = 0  # logits_audit bytes the separate decode read back
    # "top-k": a server's top-k log-probabilities against the oracle's log-softmax
    # (harness.topk_audit): each step's max_abs is its worst log-probability difference
    kind: Literal["full-row", "top-k"] = "full-row"
    top_k: int | None = None
    logprob_bound: float | None = None  # 2 x logits_max_abs
    unseen: str | None = None  # what a top-k audit cannot see


class ConcurrencyRecord(_Strict):
    """Claim concurrency_invariance: this prompt among ``requests`` in flight together (its
    place: ``slot``) against its stream alone (the record's ``tokens``)."""
    requests: int = Field(ge=2)
    slot: int = Field(ge=0)
    tokens: list[int]
    digest: str
    first_difference: int | None = None
    steps_compared: int = Field(ge=0)
    max_logprob_delta: float | None = None
    worst_step: int | None = None
    logprob_bound: float
    concurrent_verdict: Literal["identical", "near-tie", "defect"] | None = None


class BandRecord(_Strict):
    """Claim 1d: a quantized engine's stream against its scheme's calibrated band
    (``engines/quantized_bands.json``): the bounds and where they came from, and what this
    stream showed."""
    scheme: str
    bounds: dict[str, float]  # near_tie_margin, step_max_abs, step_nmse, step_kl, mean_kl, ...
    provenance: dict[str, Any] = Field(default_factory=dict)
    steps: int = Field(ge=0)
    mean_kl: float | None = None
    p99_kl: float | None = None
    flips: int = Field(ge=0)
    flip_p: float  # P(at least this many flips | the band's flip rate)
    reasons: list[str] = Field(default_factory=list)
    within: bool
    worst: dict[str, float] = Field(default_factory=dict)  # this stream's value per bound
    ratios: dict[str, float] = Field(default_factory=dict)  # each over its bound
    first_step: int | None = None  # the first step beyond a per-step bound


class QualityRecord(_Strict):
    """Beside the verdict, never part of it: the stream's rows against the float model the
    package declares it was quantized from (``package.yaml`` ``original``), on the same
    prefix, in ``llama-perplexity --kl-divergence``'s terms (``harness.quality``)."""
    original: PackageRef
    positions: int = Field(ge=0)
    kl: dict[str, float]  # mean, median, p90, p99, max (nats, the original as P)
    same_top: float  # share of steps whose argmax is the original's
    delta_p: dict[str, float]  # the chosen token's probability, engine minus original
    ppl_ratio: float | None = None


class GreedyRef(_Strict):
    """A speculative cell's own greedy stream (same engine), judged on its own prefix."""
    tokens: list[int]
    digest: str
    verdict: Literal["identical", "near-tie", "defect"]
    first_finding: Divergence | None = None
    agrees_with_speculative: bool
    first_difference: int | None = None  # first step where the two streams part


class ErrorInfo(_Strict):
    """What went wrong in an ``error`` cell: where, the exception, a short traceback."""
    stage: str  # a harness.cells.Stage when lockstep wrote it; read back as any string
    type: str
    message: str
    step: int | None = None
    traceback: list[str] = Field(default_factory=list)


class GraphSlotRecord(_Strict):
    captures: Count = 0
    replays: Count = 0
    fallbacks: Count = 0
    invalidations: Count = 0
    resets: Count = 0


class LedgerRecord(_Strict):
    """Mirror of ``engines.ledger.Ledger.to_dict()``; a suite test keeps the two in sync."""
    host_staging: Count = 0
    host_staging_bytes: Count = 0
    host_staging_sites: list[str] = Field(default_factory=list)
    readback_bytes: dict[str, Count] = Field(default_factory=dict)
    readback_count: dict[str, Count] = Field(default_factory=dict)
    h2d_bytes: Count = 0
    h2d_count: Count = 0
    forwards: dict[str, Count] = Field(default_factory=dict)
    forward_positions: dict[str, Count] = Field(default_factory=dict)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    graph_slots: dict[str, GraphSlotRecord] = Field(default_factory=dict)
    snapshots: Count = 0
    restores: Count = 0
    proposals: Count = 0
    accepted: Count = 0
    rejected: Count = 0
    rollbacks: Count = 0
    full_accepts: Count = 0
    shifted_verifications: Count = 0
    discarded_forwards: Count = 0
    live_allocations: Count | None = None
    live_bytes: Count | None = None


class MemorySample(_Strict):
    iteration: int = Field(ge=0)
    live_allocations: int | None = None
    live_bytes: int | None = None
    free_bytes: int | None = None


class Timings(_Strict):
    wall_s: float = Field(ge=0)
    tokens_per_s: float | None = None
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    # the judge's wall time for this cell (oracle forwards, guesses, verdicts), beside the
    # engine's own ``wall_s``; None in records written before it was measured
    judge_s: float | None = Field(default=None, ge=0)
    oracle_forwards: int | None = Field(default=None, ge=0)  # the oracle's, for this cell
    oracle_positions: int | None = Field(default=None, ge=0)  # positions they fed


class BudgetCheck(_Strict):
    """One budget: e.g. claim=zero_staging, budget=0, measured=0, unit=bytes."""
    claim: Claim
    budget: float
    measured: float
    unit: str | None = None
    verdict: Literal["pass", "fail"]
    note: str | None = None


class EvidenceRecord(_Strict):
    schema_version: Literal[2] = SCHEMA_VERSION
    run_id: str = Field(min_length=1)
    created: AwareDatetime = Field(default_factory=utc_now)
    environment: Environment
    package: PackageRef
    engine: str = Field(min_length=1)
    # what the engine really ran when not the package's components (Engine.provenance():
    # a builder or loader, its version, precision, the checkpoint's hash); None: the package
    engine_provenance: dict[str, Any] | None = None
    # module:Class of an engine named by its class, not registered under its name (None for
    # a registered one), so explain and repro load it again without --engine
    # (a class lockstep makes for an engine spelled as a URL is named with it in brackets)
    engine_class: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\S*$")
    mode: Mode
    prompt: PromptRef
    status: Status = "identical"  # the cell's verdict: worst of what was found
    reason: str | None = None
    error: ErrorInfo | None = None
    tokens: list[int] = Field(default_factory=list)
    tokens_text: list[str] | None = None
    token_digest: str  # sha256 of the int32 ids (of [] where the cell emitted nothing)
    reference: ReferenceRef | None = None  # the oracle's own stream (None: it failed)
    divergence: Divergence | None = None
    judgement: Judgement | None = None
    logits_audit: LogitsAuditRecord | None = None
    greedy: GreedyRef | None = None
    concurrency: ConcurrencyRecord | None = None
    # Engine.numeric_scheme(): a quantized engine's scheme; its band (if any) is that scheme's
    numeric_scheme: str | None = Field(default=None, pattern=NUMERIC_SCHEME)
    band: BandRecord | None = None  # its band and this stream's statistics
    quality: QualityRecord | None = None  # against the original float model, where declared
    ledger: LedgerRecord = Field(default_factory=LedgerRecord)
    memory_series: list[MemorySample] = Field(default_factory=list)
    acceptance_per_round: list[int] = Field(default_factory=list)
    timings: Timings | None = None
    budgets: list[BudgetCheck] = Field(default_factory=list)
    verdicts: dict[Claim, Verdict] = Field(default_factory=dict)

    @field_validator("ledger", mode="before")
    @classmethod
    def _ledger_from_object(cls, value: Any) -> Any:
        return value.to_dict() if isinstance(value, Ledger) else value

    @field_validator("created")
    @classmethod
    def _created_is_utc(cls, value: datetime) -> datetime:
        if value.utcoffset().total_seconds() != 0:
            raise ValueError(f"created must be UTC (offset {value.utcoffset()})")
        return value

    @field_validator("created")
    @classmethod
    def _created_by_a_run(cls, value: datetime) -> datetime:
        return run_time(value, "created")

    @model_validator(mode="after")
    def _status_is_what_it_holds(self) -> "EvidenceRecord":
        # ``status`` is derived from the record's own findings (found_status); a writer
        # that leaves it out gets it derived, a written one must agree with the findings
        found, shown_by = found_status(self)
        if "status" not in self.model_fields_set:
            self.status = found
        elif self.status != found and not (self.status == UNAVAILABLE and found == IDENTICAL
                                           and self.judgement is None):
            raise _inconsistent("status", f"status is written as {self.status!r} but the "
                                          f"record holds {found!r} ({shown_by})")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "EvidenceRecord":
        expected = token_digest(self.tokens)
        if self.token_digest != expected:
            raise _inconsistent("token_digest",
                                f"token_digest {self.token_digest!r} does not match tokens "
                                f"(sha256 of int32 ids is {expected!r})")
        if self.tokens_text is not None and len(self.tokens_text) != len(self.tokens):
            raise _inconsistent("tokens_text", f"tokens_text has {len(self.tokens_text)} entries for "
                             f"{len(self.tokens)} tokens")
        j = self.judgement
        if j is not None and j.steps_judged > len(self.tokens):  # a step is a token judged
            raise _inconsistent("judgement.steps_judged",
                                f"judgement.steps_judged is written as {j.steps_judged} but "
                                f"the record holds {len(self.tokens)} tokens")
        if self.band is not None and self.band.scheme != self.numeric_scheme:
            raise _inconsistent("numeric_scheme",
                                f"numeric_scheme is written as {self.numeric_scheme!r} but the "
                                f"band the stream was judged by is {self.band.scheme!r}'s")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _check_written_ok(cls, data: Any, handler, info: ValidationInfo):
        # ``ok`` is written for readers of the JSON (jq '.ok') but always recomputed; a
        # written value that disagrees with the content means the file was edited. Defined
        # after the other model validators, so it wraps them: a ``status`` edited by hand is
        # named as such before the ``ok`` it changes.
        if isinstance(data, dict) and info.context == FROM_FILE:
            for name in WRITTEN:
                if name not in data:
                    raise _inconsistent(name, f"{name} is missing: every record lockstep "
                                              f"writes holds it")
        written = unset = object()
        if isinstance(data, dict) and "ok" in data:
            data = dict(data)
            written = data.pop("ok")
        record = handler(data)
        if written is not unset and written is not record.ok:
            raise _inconsistent("ok", f"ok is written as {written!r} but the record's "
                                      f"divergence, budgets and verdicts give {record.ok!r}")
        return record

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """No failing status (error, non-finite, defect, drift), no defect divergence, no
        failed budget, no failed claim; near-ties and unavailable cells do not fail."""
        if self.status in FAILING:
            return False
        if self.divergence is not None and self.divergence.verdict == "defect":
            return False
        if any(b.verdict == "fail" for b in self.budgets):
            return False
        return all(v != "fail" for v in self.verdicts.values())

    @property
    def cell(self) -> tuple[str, str, str]:
        """The matrix cell this record belongs to: (package, engine, mode label)."""
        return (self.package.name, self.engine, self.mode.label)


def found_status(record: EvidenceRecord) -> tuple[str, str]:
    """The status ``record`` stands for by what it holds, worst first as ``harness.judgement.worst``
    orders them (an error, non-finite or out-of-tolerance logits rows, defect or near-tie steps
    of its judgement, divergence or greedy stream, a stream that parts or moves among
    concurrent requests, a stream beyond its quantized band, failed budgets and claims), and
    a few words
    on what shows it. ``identical`` when nothing is found: a record cannot show it was
    ``unavailable``, so that status stands only where nothing was judged."""
    found: list[tuple[str, str]] = []
    if record.error is not None:
        non_finite = record.error.type == NonFiniteLogits.__name__
        found.append((NON_FINITE if non_finite else ERROR,
                      f"error: {record.error.type} at stage {record.error.stage}"))
    audit = record.logits_audit
    if audit is not None and audit.non_finite_steps:
        found.append((NON_FINITE, f"logits_audit: {audit.non_finite_steps} non-finite row(s)"))
    if audit is not None and audit.out_of_tolerance_steps:
        found.append((DRIFT, f"logits_audit: {audit.out_of_tolerance_steps} row(s) out of "
                             f"tolerance"))
    j = record.judgement
    if j is not None and j.defects:
        found.append((DEFECT, f"judgement: {j.defects} defect step(s)"))
    elif j is not None and j.near_ties:
        found.append((NEAR_TIE, f"judgement: {j.near_ties} near-tie step(s)"))
    if record.divergence is not None:
        found.append((record.divergence.verdict,
                      f"divergence: {record.divergence.verdict} at step {record.divergence.step}"))
    g = record.greedy
    if g is not None and g.verdict == DEFECT:
        found.append((DEFECT, "greedy: its greedy stream has a defect"))
    if g is not None and not g.agrees_with_speculative:
        found.append((NEAR_TIE, f"greedy: speculative and greedy part at step "
                                f"{g.first_difference}"))
    c = record.concurrency
    if c is not None and c.first_difference is not None:
        found.append((DEFECT, f"concurrency: among {c.requests} requests the stream parts "
                              f"from the stream alone at step {c.first_difference}"))
    elif c is not None and c.max_logprob_delta is not None and \
            not c.max_logprob_delta <= c.logprob_bound:  # NaN included
        found.append((DRIFT, f"concurrency: log-probabilities move by {c.max_logprob_delta:.3g} "
                             f"among {c.requests} requests"))
    if record.band is not None and not record.band.within:
        found.append((DRIFT, f"band: beyond the {record.band.scheme} band"))
    failed = [b.claim for b in record.budgets if b.verdict == "fail"]
    if failed:
        found.append((BUDGET, f"budgets: {', '.join(dict.fromkeys(failed))} failed"))
    for claim, verdict in record.verdicts.items():
        if verdict == "fail":
            found.append((CLAIM_REGISTRY[claim].fails_as, f"verdicts: {claim} failed"))
    if not found:
        return IDENTICAL, "no error, no finding, no failed budget or claim"
    status = worst(*(st for st, _ in found))
    return status, "; ".join(why for st, why in found if st == status)


def evidence_json_schema() -> dict[str, Any]:
    """JSON Schema of an evidence file as written (``ok`` included, read-only)."""
    return EvidenceRecord.model_json_schema(mode="serialization")
