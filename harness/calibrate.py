"""``lockstep calibrate``: the procedure that makes a quantized scheme's band, and checks that
re-running it reproduces the band checked in.

A quantized engine is judged against float32 over its own dequantized weights
(``Engine.reference_package``, else the package it runs). How far an honest build of it may
be from that float32 is measured here, never at judge time:

1. **Corpus.** Our own text (``harness/texts/calibration/corpus.yaml``: prose, code,
   digits, chat; at least ``MIN_POSITIONS`` positions to write a band), tokenized by the
   package's tokenizer (chat segments through its chat template). Its hash covers the manifest
   and every file it names.
2. **Scoring, teacher-forced.** The oracle scores each segment in one forward
   (``Oracle.stream_rows``). The engine scores it from an empty cache in each of its batch
   shapes (``Engine.batch_shapes``: llama.cpp all at once and one position a decode, which
   are not bit identical; onnxruntime-genai one position an append and eight), and every row
   it exposes is compared with the oracle's at the same position: max abs, NMSE, KL (the
   oracle as P), whether the argmax flipped and by how much (the oracle's best minus its
   logit of the engine's argmax). The shapes are compared with each other too.
3. **Observed worst values**, over every row of every shape: the per-step bounds (max abs,
   NMSE, KL), the worst flip's gap, the flip rate of the worse shape, and the stream
   statistics over every run of ``WINDOW`` consecutive rows (mean KL, 99th percentile).
4. **The band**: each bound ``HEADROOM`` (2) times its worst observed value, rounded up to
   two significant digits; the flip rate twice the observed, at least ``3 / rows`` (the
   95% upper bound where no flip was seen).
5. **Mutations** (``harness.mutations``, the engine's planted bugs) are scored the same way
   (in the engine's first batch shape) and each must land at least ``MUTATION_FACTOR`` (10)
   times beyond the band on some metric; else no band is written.
6. **Reproduction.** A re-run reproduces a checked-in band when each observed worst value
   is within ``REPRODUCE_WITHIN`` (20%) of the one recorded (then the checked-in band still
   has at least 2 / 1.2 = 1.67 times headroom over it) and every mutation is still caught
   tenfold by the checked-in band. On one machine the figures are bit for bit the same (both
   engines and the oracle are deterministic there).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from engines.errors import InputError
from engines.oracle import Oracle
from engines.registry import REFERENCE_ENGINE, get_engine_class
from engines.tolerances import BANDS_FILE, Band
from harness.evidence import collect_environment
from harness.prompts import chat_prompt, resolve, text_prompt
from harness.quality import original_package, summarize
from harness.row_compare import compare_rows

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_FILE = Path(__file__).resolve().parent / "texts" / "calibration" / "corpus.yaml"
# A corpus's files lie in its manifest's folder; ours may also reach the shared texts above
# it (``../long_context.txt``, the long prompts' text): the checked-in bands record the hash
# of its manifest as written.
SHARED_TEXTS = CORPUS_FILE.parent.parent
KIND = "lockstep-calibrate"
MARKER = f'"kind": "{KIND}"'  # in a file's first bytes: `calibrate --json` may replace it
MIN_POSITIONS = 1500  # a band is written from no fewer corpus positions
WINDOW = 16  # stream statistics: runs of this many consecutive rows (band.window)
HEADROOM = 2.0
MUTATION_FACTOR = 10.0
REPRODUCE_WITHIN = 0.20
KINDS = ("plain", "chat")
SEGMENT_KEYS = ("name", "kind", "topic", "file")  # a corpus segment's keys
# bound -> what it bounds in ``Observed`` (a mutation's ratio is its value over the bound)
BOUNDS = ("near_tie_margin", "step_max_abs", "step_nmse", "step_kl", "mean_kl", "p99_kl",
          "flip_rate")


# -- corpus ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    name: str
    kind: str
    topic: str
    ids: list[int]


@dataclass(frozen=True)
class Corpus:
    path: Path
    hash: str
    segments: list[Segment]

    @property
    def positions(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    def describe(self) -> dict:
        return {"file": _shown(self.path), "hash": self.hash, "positions": self.positions,
                "segments": {s.name: {"kind": s.kind, "topic": s.topic,
                                      "positions": len(s.ids)} for s in self.segments}}


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def load_corpus(package, path: Path | str = CORPUS_FILE,
                only: Sequence[str] | None = None) -> Corpus:
    """The corpus manifest at ``path``, its segments tokenized for ``package`` (``only``:
    these segments, by name; the hash then covers those). Every problem names the manifest
    field."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} does not exist", field="--corpus", value=str(path),
                         remedy=f"give a corpus manifest such as {_shown(CORPUS_FILE)}")
    raw = path.read_bytes()
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError:
        doc = None
    entries = doc.get("segments") if isinstance(doc, dict) else None
    others = sorted(map(str, set(doc) - {"segments"})) if isinstance(doc, dict) else []
    if not isinstance(entries, list) or not entries:
        found = f" (it holds {', '.join(others)})" if others else ""  # segments misspelt
        raise InputError(f"{path} holds no list of segments{found}", field="segments",
                         value=str(path), remedy="write segments: [{name, kind, topic, file}]",
                         where=str(path))
    digest = hashlib.sha256(b"manifest\0" + raw)
    names = [e.get("name") for e in entries if isinstance(e, dict)]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise InputError(f"the corpus has no segment {unknown[0]!r}", field="--segments",
                         value=unknown[0], remedy=f"choose from: {', '.join(map(str, names))}")
    segments = []
    for where, entry, file in _checked_segments(path, entries):
        if only and entry["name"] not in only:
            continue
        data = file.read_bytes()
        digest.update(f"\0{entry['name']}\0{entry['kind']}\0".encode() + data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"{file} is not UTF-8 text (byte {err.start})",
                             field=f"{where}.file", value=entry["file"],
                             remedy="save the segment as UTF-8 text", where=str(path)) from None
        if entry["kind"] == "plain":
            source = text_prompt(text, f"{where}.file")
        else:
            try:
                messages = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise InputError(f"{file} is not YAML ({err})", field=f"{where}.file",
                                 value=entry["file"], remedy="write the chat as a YAML list "
                                 "of {role, content}", where=str(path)) from None
            source = chat_prompt(messages, f"{where}.file")
        ids = resolve(source, package).ids
        segments.append(Segment(entry["name"], entry["kind"], entry.get("topic", ""), ids))
    return Corpus(path, f"sha256:{digest.hexdigest()}", segments)


def _checked_segments(path: Path, entries: list) -> list[tuple[str, dict, Path]]:
    """(field, entry, file) for each of the manifest's segments, every one checked before
    any is read or tokenized."""
    root = SHARED_TEXTS if path.resolve() == CORPUS_FILE else path.parent.resolve()
    checked, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"segments[{i}]"
        if not isinstance(entry, dict) or not {"name", "kind", "file"} <= set(entry):
            raise InputError("a segment needs name, kind and file", field=where, value=entry,
                             remedy="write {name, kind: plain|chat, topic, file}",
                             where=str(path))
        unknown = [key for key in entry if key not in SEGMENT_KEYS]
        if unknown:  # a misspelt or invented key would be ignored, the corpus not as written
            raise InputError(f"unknown key {unknown[0]!r} in a corpus segment",
                             field=f"{where}.{unknown[0]}", value=entry[unknown[0]],
                             remedy=f"a segment holds {', '.join(SEGMENT_KEYS)} only",
                             where=str(path))
        if not isinstance(entry["name"], str) or not entry["name"].strip():
            # --segments and the results name a segment by its text: 5 would never match "5"
            raise InputError("a segment's name is text", field=f"{where}.name",
                             value=entry["name"], remedy=f"quote it (name: "
                                                         f"'{entry['name']}')", where=str(path))
        if entry["name"] in seen:
            raise InputError("two segments share one name (--segments and the results "
                             "name a segment by it)", field=f"{where}.name",
                             value=entry["name"], remedy="give each segment its own name",
                             where=str(path))
        seen.add(entry["name"])
        if entry["kind"] not in KINDS:
            raise InputError("unknown segment kind", field=f"{where}.kind",
                             value=entry["kind"], remedy=f"use one of: {', '.join(KINDS)}",
                             where=str(path))
        file = path.parent / str(entry["file"])
        if not file.resolve().is_relative_to(root):
            raise InputError(f"{entry['file']} lies outside the corpus folder {path.parent} "
                             "(a corpus is its manifest and the files beside it)",
                             field=f"{where}.file", value=entry["file"],
                             remedy="name a file beside the manifest (copy it there)",
                             where=str(path))
        if not file.is_file():
            what = "is a folder, not a file" if file.is_dir() else "does not exist"
            raise InputError(f"{file} {what}", field=f"{where}.file",
                             value=entry["file"], remedy="name a file beside the manifest",
                             where=str(path))
        checked.append((where, entry, file))
    return checked


# -- comparing rows ----------------------------------------------------------------------

@dataclass
class RowStats:
    """One shape's rows of one segment against the oracle's rows at the same positions."""
    segment: str
    shape: int | None
    positions: np.ndarray
    max_abs: np.ndarray
    nmse: np.ndarray
    kl: np.ndarray
    flipped: np.ndarray  # the engine's argmax is not the oracle's
    gap: np.ndarray  # the oracle's best logit minus its logit of the engine's argmax
    margin: np.ndarray  # the oracle's top-2 margin
    argmax: np.ndarray  # the engine's argmax


def score(engine, corpus: Corpus, oracle_rows: dict[str, np.ndarray],
          shapes: Sequence[int | None], consistency: dict | None = None,
          original: tuple[dict, list] | None = None) -> list[RowStats]:
    """Every segment in every shape on ``engine`` against the oracle's rows; with
    ``consistency`` (a dict), each shape's rows against the first shape's are added to it
    (``self_consistency``); with ``original`` (the original float model's rows by segment, a
    list), the first shape's rows against the original's, with the text's next tokens, are
    appended to that list (``harness.quality``)."""
    out = []
    for segment in corpus.segments:
        reference = oracle_rows[segment.name]
        scored = {}
        for shape in shapes:
            positions, rows = engine.teacher_forced(segment.ids, shape)
            positions = np.asarray(positions, dtype=np.int64)
            scored[shape] = (positions, rows)
            out.append(RowStats(segment.name, shape, positions,
                                **compare_rows(rows, reference[positions])))
        if consistency is not None:
            self_consistency(scored, consistency)
        if original is not None:
            rows_of, into = original
            positions, rows = scored[shapes[0]]
            keep = positions < len(segment.ids) - 1  # the last position has no next token
            ids = np.asarray(segment.ids)
            into.append(compare_rows(rows[keep], rows_of[segment.name][positions[keep]],
                                     tokens=ids[positions[keep] + 1]))
    return out


def oracle_rows(package, corpus: Corpus, oracle_engine=None) -> dict[str, np.ndarray]:
    """The float32 oracle's rows at every position of every segment (one forward each, a
    fresh ``Oracle`` per segment so its cache does not hold the whole corpus)."""
    engine = oracle_engine or get_engine_class(REFERENCE_ENGINE)(package)
    rows = {}
    for segment in corpus.segments:
        oracle = Oracle(package, engine)
        ids = segment.ids
        rows[segment.name] = np.asarray(oracle.stream_rows(ids[:1], ids[1:]), dtype=np.float32)
    return rows


# -- what was observed, and the band ------------------------------------------------------

def windows(values: np.ndarray, width: int = WINDOW):
    """Every run of ``width`` consecutive values (the whole array where it is shorter)."""
    if len(values) <= width:
        return [values] if len(values) else []
    view = np.lib.stride_tricks.sliding_window_view(values, width)
    return list(view)


def observe(stats: Sequence[RowStats]) -> dict:
    """The worst values over ``stats`` (one engine: all its shapes and segments), and
    where each per-step one was seen."""
    found: dict = {"rows": sum(len(s.kl) for s in stats)}
    for key, metric in (("step_max_abs", "max_abs"), ("step_nmse", "nmse"),
                        ("step_kl", "kl"), ("near_tie_margin", "gap")):
        found[key], found[f"{key}_at"] = 0.0, None
        for s in stats:
            values = getattr(s, metric) * (s.flipped if metric == "gap" else 1)
            if len(values) and float(values.max()) > found[key]:
                i = int(np.argmax(values))
                found[key] = float(values[i])
                found[f"{key}_at"] = f"{s.segment} @ {int(s.positions[i])} ({_shape(s.shape)})"
    runs = [w for s in stats for w in windows(s.kl)]
    found["mean_kl"] = max((float(np.mean(w)) for w in runs), default=0.0)
    found["p99_kl"] = max((float(np.percentile(w, 99)) for w in runs), default=0.0)
    flips: dict = {}
    for s in stats:
        n, f = flips.get(s.shape, (0, 0))
        flips[s.shape] = (n + len(s.kl), f + int(s.flipped.sum()))
    found["flip_rate"] = max((f / n for n, f in flips.values() if n), default=0.0)
    found["flips"] = {_shape(k): f"{f}/{n}" for k, (n, f) in flips.items()}
    found["kl_mean_all"] = (float(np.mean(np.concatenate([s.kl for s in stats])))
                            if found["rows"] else 0.0)
    return found


def _shape(shape: int | None) -> str:
    return "all at once" if shape is None else f"{shape} a piece"


def round_up(value: float, digits: int = 2) -> float:
    """``value`` rounded up to ``digits`` significant digits (0 stays 0)."""
    if value <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(value)) - digits + 1)
    return float(f"{math.ceil(round(value / scale, 9)) * scale:.{digits}g}")


def band_bounds(observed: dict, rows: int) -> dict[str, float]:
    """The bounds: ``HEADROOM`` x each worst value, rounded up; the flip rate twice the
    observed, at least 3 / rows."""
    bounds = {k: round_up(HEADROOM * observed[k]) for k in BOUNDS if k != "flip_rate"}
    bounds["flip_rate"] = round_up(max(HEADROOM * observed["flip_rate"], 3.0 / max(rows, 1)))
    return bounds


def self_consistency(scored: dict, into: dict) -> dict:
    """The engine against itself on one segment: each shape's rows (``scored``: shape ->
    positions, rows) against the first shape's at the positions both expose, accumulated
    into ``into`` (max abs, worst KL, argmax agreement, by pair of shapes)."""
    shapes = list(scored)
    first = shapes[0]
    pa, ra = scored[first]
    for other in shapes[1:]:
        pb, rb = scored[other]
        common, ia, ib = np.intersect1d(pa, pb, return_indices=True)
        if not len(common):
            continue
        cmp = compare_rows(rb[ib], ra[ia])
        entry = into.setdefault(f"{_shape(other)} vs {_shape(first)}",
                                {"positions": 0, "max_abs": 0.0, "kl_max": 0.0, "same": 0})
        entry["positions"] += len(common)
        entry["max_abs"] = max(entry["max_abs"], float(cmp["max_abs"].max()))
        entry["kl_max"] = max(entry["kl_max"], float(cmp["kl"].max()))
        entry["same"] += int((~cmp["flipped"]).sum())
        entry["same_argmax"] = entry["same"] / entry["positions"]
        entry["bit_identical"] = entry["max_abs"] == 0.0
    return into


# -- mutations ---------------------------------------------------------------------------

def ratios(observed: dict, bounds: dict[str, float]) -> dict[str, float]:
    """How many times each bound a mutation's worst value is."""
    return {k: (observed[k] / bounds[k]) if bounds[k] > 0 else math.inf for k in BOUNDS}


def mutation_result(name: str, description: str, observed: dict,
                    bounds: dict[str, float]) -> dict:
    r = ratios(observed, bounds)
    metric = max(r, key=r.__getitem__)
    return {"engine": name, "description": description, "metric": metric,
            "ratio": r[metric], "caught": r[metric] >= MUTATION_FACTOR,
            "observed": {k: observed[k] for k in BOUNDS}}


# -- the whole procedure -----------------------------------------------------------------

@dataclass
class Calibration:
    band: Band
    observed: dict
    mutations: list[dict]
    self_consistency: dict
    corpus: Corpus
    notes: list[str] = field(default_factory=list)

    @property
    def refused(self) -> list[str]:
        """Why this band must not be written (empty: it may)."""
        why = [f"{m['engine']} is only {m['ratio']:.3g}x beyond the band at most "
               f"({m['metric']}); at least {MUTATION_FACTOR:g}x is required"
               for m in self.mutations if not m["caught"]]
        if not self.mutations:
            why.append("no mutation validates this band (harness.mutations has none for "
                       "this engine)")
        if self.corpus.positions < MIN_POSITIONS:
            why.append(f"the corpus has {self.corpus.positions} positions; a band is written "
                       f"from at least {MIN_POSITIONS}")
        return why


def cpu_description() -> dict:
    """The CPU this ran on: model name, logical cores, and the vector features that change
    quantized kernels (from /proc/cpuinfo where it exists)."""
    info = {"machine": platform.machine(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and "model" not in info:
            info["model"] = value.strip()
        if key.strip() == "flags":
            flags = set(value.split())
            info["features"] = sorted(f for f in flags if f.startswith(
                ("avx", "amx", "fma", "f16c", "sse4", "ssse3", "bmi2")))
            break
    return info


def calibrate(engine, package, corpus: Corpus, mutations: Sequence[type] = (),
              oracle_package=None, on_step=None) -> Calibration:
    """The whole procedure on an open ``engine`` of ``package``: its band, what was
    observed, the mutations' distances. ``oracle_package``: the float32 package over the
    engine's own dequantized weights (default ``package``)."""
    say = on_step or (lambda text: None)
    scheme = engine.numeric_scheme()
    if scheme is None:
        raise InputError(f"engine {engine.name!r} declares no numeric scheme: it is judged by "
                         f"the package dtype's row, a band would not be read",
                         field="--engine", value=engine.name,
                         remedy="calibrate a quantized engine (llama-cpp, ort-genai-int4)")
    shapes = tuple(engine.batch_shapes)
    if not shapes:
        engine.teacher_forced([0])  # raises the engine's own explanation
    reference = oracle_package or package
    say(f"oracle: {corpus.positions} positions, {len(corpus.segments)} forwards")
    oracle = oracle_rows(reference, corpus)
    say(f"{engine.name}: {len(corpus.segments)} segments x {len(shapes)} batch shapes")

    consistency: dict = {}
    original = original_package(package)
    against = None
    if original is not None:
        say(f"the original float model {original.spec.name}: {len(corpus.segments)} forwards")
        against = (oracle_rows(original, corpus), [])
    stats = score(engine, corpus, oracle, shapes, consistency, against)
    quality = None
    if against is not None:
        merged = {k: np.concatenate([c[k] for c in against[1]]) for k in against[1][0]}
        quality = {"original": {"package": original.spec.name,
                                "content_hash": original.content_hash},
                   **summarize(merged, perplexity=True).to_dict()}
        del against
    observed = observe(stats)
    bounds = band_bounds(observed, observed["rows"])
    results = []
    for cls in mutations:
        say(f"mutation {cls.name}")
        mutant = cls(package)
        try:
            found = observe(score(mutant, corpus, oracle, shapes[:1]))
        finally:
            mutant.close()
        results.append(mutation_result(cls.name, " ".join((cls.__doc__ or "").split()),
                                       found, bounds))
    env = collect_environment()
    provenance = {
        "engine": engine.name, "engine_build": engine.provenance(),
        "device": cpu_description(), "host": env.host, "platform": env.platform,
        "lockstep_commit": env.git_commit,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "package": {"name": package.spec.name, "content_hash": package.content_hash},
        "oracle": {"package": reference.spec.name, "content_hash": reference.content_hash},
        "corpus": corpus.describe(), "positions": corpus.positions, "rows": observed["rows"],
        "batch_shapes": [_shape(s) for s in shapes], "window": WINDOW,
        "headroom": HEADROOM, "observed": observed, "self_consistency": consistency,
        "mutations": results, "mutation_factor": MUTATION_FACTOR,
        "reproduce_within": REPRODUCE_WITHIN,
        "procedure": "lockstep calibrate (harness/calibrate.py, docs/QUANTIZED.md)",
    }
    if quality is not None:  # information beside the band, never part of it
        provenance["quality"] = quality
    band = Band(scheme=scheme, window=WINDOW, provenance=provenance, **bounds)
    return Calibration(band, observed, results, consistency, corpus)


# -- the checked-in table, and reproducing it ---------------------------------------------

def write_band(band: Band, path: Path = BANDS_FILE) -> Path:
    """``band`` into the table at ``path`` (other schemes kept), written atomically."""
    data = {"schemes": {}}
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
    row = band.to_dict()
    data["schemes"][row.pop("scheme")] = row
    data["schemes"] = dict(sorted(data["schemes"].items()))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


@dataclass
class Reproduction:
    """A re-run against the checked-in band of its scheme."""
    metrics: list[tuple[str, float, float, float, bool]]  # name, checked in, now, change, ok
    mutations: list[tuple[str, str, float, bool]]  # engine, metric, ratio to checked-in, ok
    bounds: list[tuple[str, float, float]]  # name, checked-in bound, the re-run's bound
    problems: list[str]

    @property
    def reproduced(self) -> bool:
        return not self.problems


def reproduce(new: Calibration, old: Band, within: float | None = None) -> Reproduction:
    """Does ``new`` reproduce the checked-in ``old``: each observed worst value within
    ``within`` (the old row's ``reproduce_within``) of the recorded one, and every mutation
    still at least ``MUTATION_FACTOR`` beyond the checked-in band."""
    within = old.provenance.get("reproduce_within", REPRODUCE_WITHIN) if within is None \
        else within
    was = old.provenance.get("observed", {})
    metrics, problems = [], []
    for key in BOUNDS:
        before, now = was.get(key), new.observed[key]
        if before is None:
            problems.append(f"the checked-in {old.scheme} band records no observed {key}")
            continue
        change = (now - before) / before if before else (0.0 if now == 0 else math.inf)
        ok = abs(change) <= within
        metrics.append((key, before, now, change, ok))
        if not ok:
            problems.append(f"observed {key} {now:.4g} is {change:+.1%} from the checked-in "
                            f"{before:.4g} (within {within:.0%} reproduces)")
    bounds = {k: getattr(old, k) for k in BOUNDS}
    mutations = []
    for m in new.mutations:
        r = ratios(m["observed"], bounds)
        metric = max(r, key=r.__getitem__)
        ok = r[metric] >= MUTATION_FACTOR
        mutations.append((m["engine"], metric, r[metric], ok))
        if not ok:
            problems.append(f"{m['engine']} is only {r[metric]:.3g}x beyond the checked-in "
                            f"band ({metric})")
    return Reproduction(metrics, mutations,
                        [(k, getattr(old, k), getattr(new.band, k)) for k in BOUNDS], problems)


__all__ = ["CORPUS_FILE", "KIND", "MARKER", "Calibration", "Corpus", "MIN_POSITIONS", "Reproduction",
           "Segment", "band_bounds", "calibrate", "load_corpus", "observe",
           "reproduce", "round_up", "write_band"]
