"""The one tolerance table: tensors per dtype with the metric named; tokens are exact.

``near_tie_margin`` is how far below the oracle's best logit (on the engine's own prefix) an
engine's token may be and still pass as a ``near-tie`` rather than a ``defect``. Fixture
builders reject any seed whose oracle margin falls below it, so on fixtures token identity
is a hard claim.

``logits_max_abs`` and ``logits_nmse`` bound a whole model's logits row against the
oracle's (the logits audit, claim 1b): unlike a single op's output they carry the rounding
of every layer, so they have their own row entries. float32: native-host against ort-cpu
on SmolLM2 (30 layers) differs by up to 2e-4 absolute, NMSE 4e-10; a logits row rounded
through float16 differs by about 8e-3 at |logit| 16 and NMSE about 1e-7, so both bounds
separate the two.

float16 and bfloat16: the logits rows' entries and the near-tie margin are measured on
SmolLM2-135M converted by ``lockstep convert --dtype float16|bfloat16`` (mixed precision:
norms, softmax, rotary and the residual stream in float32; weights, KV cache, MatMuls and
logits in the reduced dtype), judged as the runner judges them: against the package's
reference, its float32 twin, on ort-cpu (``engines.oracle.oracle_for``). Six default prompts
x up to 32 greedy tokens (155 steps: two prompts end at eos), every step's logits row against
the twin's row on the engine's own prefix; "gap error" is the error on the oracle's best
logit minus each of its next four, the quantity a near-tie margin must cover. Measured with
``python -m suites.measure_reduced_precision`` on the 2-core CPU machine (onnxruntime 1.32.0,
numpy 2.4.6, onnx 1.23.2):

    dtype     engine          worst max abs  worst NMSE  worst gap error  tokens vs twin
    float16   ort-cpu         0.064          3.3e-5      0.041            identical (6/6)
    float16   native-host     0.124          2.3e-4      0.048            identical (6/6)
    float16   onnx-reference  0.113          1.4e-4      0.061            identical (6/6)
    bfloat16  native-host     1.11           1.4e-2      0.41             4 near-ties 0.018-0.110
    bfloat16  onnx-reference  1.31           1.8e-2      0.40             2 near-ties 0.110, 0.112
    (ort-cpu cannot run bfloat16: its CPU provider has no bfloat16 MatMul)

Medians: float16 max abs 0.03, NMSE 2.5e-6; bfloat16 0.27, 1.5e-4. For scale, transformers on
the same weights (its model cast to the reduced dtype: eager attention, residual stream in
that dtype), over every position of the same six prompts plus 8 tokens, differs from its own
float32 by up to 0.28 / NMSE 1.3e-4 in float16 and 1.9 / 1.1e-2 in bfloat16: the converter's
packages are no further from float32 than a real engine. The rows keep 2x headroom in amplitude
over the worst engine (max abs and near-tie margin at least 2x, NMSE at least 4x, i.e. 2x
squared): float16 0.25 / 1e-3 / margin 0.125; bfloat16 3.0 / 8e-2 / margin 1.0. The bfloat16
bounds are loose by nature (8 mantissa bits over 30 blocks): a bfloat16 engine is better held
to another engine running the same package than to the twin alone. The per-op entries
(``max_abs``, ``max_rel``, ``nmse``) are unchanged: one op's rounding, not a model's.
"""
from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from engines.errors import InputError


@dataclass(frozen=True)
class Tolerance:
    dtype: str
    max_abs: float  # metric, elementwise: |a - b| <= max_abs + max_rel * |b|  (allclose)
    max_rel: float  # (the relative part of the same elementwise bound)
    nmse: float  # metric, whole tensor: sum((a-b)^2) / sum(b^2)
    near_tie_margin: float  # metric: oracle's best logit minus the engine token's logit
    logits_max_abs: float  # metric, a logits row: max |engine - oracle| (no relative part)
    logits_nmse: float  # metric, a logits row: sum((a-b)^2) / sum(b^2)

    @property
    def logits(self) -> "Tolerance":
        """This row's logits bounds as a tensor tolerance (``compare_tensors`` takes it)."""
        return Tolerance(self.dtype, self.logits_max_abs, 0.0, self.logits_nmse,
                         self.near_tie_margin, self.logits_max_abs, self.logits_nmse)


TABLE: dict[str, Tolerance] = {
    "float64": Tolerance("float64", max_abs=1e-9, max_rel=1e-9, nmse=1e-18, near_tie_margin=1e-6,
                         logits_max_abs=1e-9, logits_nmse=1e-18),
    "float32": Tolerance("float32", max_abs=1e-4, max_rel=1e-3, nmse=1e-8, near_tie_margin=1e-2,
                         logits_max_abs=1e-3, logits_nmse=1e-8),
    # logits and near-tie entries: measured on SmolLM2 against the float32 twin (docstring)
    "float16": Tolerance("float16", max_abs=1e-2, max_rel=1e-2, nmse=1e-4,
                         near_tie_margin=0.125, logits_max_abs=0.25, logits_nmse=1e-3),
    "bfloat16": Tolerance("bfloat16", max_abs=5e-2, max_rel=5e-2, nmse=1e-3,
                          near_tie_margin=1.0, logits_max_abs=3.0, logits_nmse=8e-2),
}

TOKENS = "exact"

# -- quantized schemes: bands measured by `lockstep calibrate`, checked in with provenance ---
# An engine that computes with quantized weights or activations (``Engine.numeric_scheme``)
# is not judged by float32 identity: against the float32 oracle over its own dequantized
# weights it is held to its scheme's band, measured on a teacher-forced corpus on an honest
# build of the engine and checked in here (``quantized_bands.json``, written by ``lockstep
# calibrate --write``; ``docs/QUANTIZED.md`` has the procedure and every row's provenance).
# A band is never derived from the engine being judged at judge time.
BANDS_FILE = Path(__file__).with_name("quantized_bands.json")


@dataclass(frozen=True)
class Band:
    scheme: str
    near_tie_margin: float  # metric: oracle's best logit minus the engine token's logit
    step_max_abs: float  # metric, a logits row: max |engine - oracle|
    step_nmse: float  # metric, a logits row: sum((a-b)^2) / sum(b^2)
    step_kl: float  # metric, a logits row: KL(oracle || engine) of the softmaxes, nats
    mean_kl: float  # metric, a stream: mean of its steps' KL
    p99_kl: float  # metric, a stream: 99th percentile of its steps' KL
    flip_rate: float  # metric, a stream: share of steps whose token is not the oracle's argmax
    # mean and p99 KL are checked on streams of at least this many steps (calibrated over every
    # run of this many consecutive positions: a shorter stream's mean is one step's noise)
    window: int = 16
    provenance: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def tolerance(self) -> Tolerance:
        """This band as the tolerance row the judge and the audit read (the per-op entries
        are float32's: a band bounds a whole model's logits, never one op)."""
        f32 = TABLE["float32"]
        return Tolerance(self.scheme, f32.max_abs, f32.max_rel, f32.nmse, self.near_tie_margin,
                         self.step_max_abs, self.step_nmse)

    def to_dict(self) -> dict:
        return asdict(self)


def bands(path: Path | None = None, option: str | None = None) -> dict[str, Band]:
    """The checked-in bands by scheme (``BANDS_FILE``; none when the file is absent). A
    table that cannot be read is an ``InputError`` naming ``option`` (the one that gave
    ``path``; else the file)."""
    path = BANDS_FILE if path is None else path
    if not path.exists():
        return {}

    def refuse(why: str) -> InputError:
        return InputError(f"{path} {why}", field=option or path.name, value=str(path),
                          remedy='give a bands table {"schemes": {SCHEME: {...}}} as written by '
                                 "lockstep calibrate --write, or a path where none exists yet")

    if path.is_dir():
        raise refuse("is a folder, not a bands table")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise refuse(f"cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise refuse(f"is not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise refuse(f"is not valid JSON ({err})") from None
    schemes = data.get("schemes") if isinstance(data, dict) else None
    if not isinstance(schemes, dict):
        raise refuse('holds no "schemes" mapping')
    out = {}
    for scheme, row in schemes.items():
        problems = _band_problems(row)
        if problems:
            raise refuse(f"holds a row {scheme!r} that is not a band: {'; '.join(problems)}")
        out[scheme] = Band(scheme=scheme, **row)
    return out


def _band_problems(row) -> list[str]:
    """What keeps ``row`` (one scheme's entry of the table) from being a ``Band``: a bound
    missing or not a finite number of at least 0, a flip rate above 1, a window that is no
    count, a field no band has."""
    if not isinstance(row, dict):
        return [f"a JSON {type(row).__name__}, not an object"]
    known = {f.name: f for f in fields(Band) if f.name != "scheme"}
    problems = [f"{name} is missing" for name, f in known.items() if name not in row
                and f.default is MISSING and f.default_factory is MISSING]
    problems += [f"{name} is not a field of a band" for name in row if name not in known]
    for name, value in row.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name == "window" and not (number and value == int(value) and value >= 1):
            problems.append(f"window = {value!r} is not a count of steps")
        elif name == "provenance" and not isinstance(value, dict):
            problems.append(f"provenance = {_short(value)} is not an object")
        elif name in known and name not in ("window", "provenance") and not (
                number and math.isfinite(value) and value >= 0):
            problems.append(f"{name} = {_short(value)} is not a finite number of at least 0")
        elif name == "flip_rate" and value > 1:  # a share of steps
            problems.append(f"flip_rate = {_short(value)} is a share of steps: at most 1")
    return problems


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def band_for(scheme: str | None) -> Band | None:
    """The band of ``scheme``, or None where no band is checked in for it."""
    return bands().get(scheme) if scheme else None


def tolerance_for(dtype) -> Tolerance:
    """The row for a dtype name or numpy dtype; an unknown dtype is an error, never a default."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(f"no tolerance row for dtype {name!r}; rows: {', '.join(TABLE)}") from None
