"""A sixth battery of bad inputs (issue 33's acceptance, measured on inputs no fix was driven
by): new options, combinations, damage and files beside those of the earlier batteries
(``test_bad_input_battery.py``, ``_fresh``, ``_third``, ``_fourth``, ``_fifth``), written
blind to the fixes being made while it was written, across every command a user types, the
files they read (prompt files, package.yaml and its files, Hugging Face folders and GGUFs,
evidence records and run manifests, onnxruntime-genai builds and onnx-genai packages, the
calibration corpus and bands table), the environment variables lockstep reads, outputs that
would land on the user's files, and Ctrl-C.

The same notion of clear as the earlier batteries: the documented exit status (2 for bad
input, 130 for an interrupt), no traceback, one ``lockstep: error:`` line naming the field and
the value (the ``needles``) with a remedy (an interrupt: one ``lockstep: interrupted`` line),
the user's files untouched, within ``SECONDS``.

First run (wip-battery6 at b2376e0: main 66ee55b and this file; the go signal did not come
within 45 minutes, so main's newer fixes were not merged; all 107 cases written before any was
run): 79 of 107 clear (73.8%), 28 not:

- a traceback: import-genai-past-key-names-without-index (``TypeError: not all arguments
  converted during string formatting``), import-genai-model-half-downloaded (protobuf's
  ``DecodeError: Wire format was corrupt``);
- the wrong field named, or refused unclearly (exit 2): run-oracle-engine-a-black-box
  (``[field --packages]``, remedy a converted package; following it, ``[field component =
  'target']; remedy: decode through engines.workflow.greedy_decode``), run-oracle-engine-a-server
  (``[field server = 'GET /v1/models']``), run-packages-a-genai-build (``has no package.yaml``:
  neither ``--packages`` nor import-genai), convert-genai-builder-with-prompt-lookup (not
  refused: the builder ran for 11 s and failed, its log quoted), report-a-package-folder (the
  package's checkpoint.json "not an evidence record", remedy "delete the file"),
  explain-record-package-changed (``[field --package = 'tiny-dynamic-float32']``, an option the
  user never gave), explain-a-bench-json (``[field run_id]``, remedy "delete the file"),
  calibrate-corpus-segment-extra-key (the engine named, the unknown key ``weight`` ignored),
  import-genai-eos-past-vocab and import-genai-prompts-from-another-tokenizer (``eos_id`` and
  ``prompts[0][1]`` of the package.yaml lockstep had just written, not genai_config.json's
  ``eos_token_id`` or ``--prompts-from``); clear by the earlier batteries' standard and failing
  only this one's needles, the remedy not naming the command that reads such a folder:
  convert-a-genai-build (import-genai), convert-a-model-package (import-package),
  import-genai-a-hugging-face-folder (convert --builder onnxruntime-genai);
- accepted (exit 0) although wrong: prompts-key-repeated (the first ``"text"`` silently
  dropped), report-baseline-is-the-evidence (the evidence compared with itself),
  repro-no-shrink-with-max-runs (``--max-runs`` silently ignored),
  import-package-genai-config-eos-a-string (``eos_token_id: "3"`` dropped: the package's
  ``eos_id`` null, 3 when intact);
- no user file overwritten, no case too slow;
- the case was wrong, not lockstep: run-prompt-comma-separated (``--prompt`` takes commas
  between ids by design: the same ids), cache-prune-max-size-in-bytes-unit (``500MB`` is
  ``500M``: a size takes an optional ``B``), convert-tensor-in-two-files (lockstep reads
  model.safetensors and leaves a stray file alone, as transformers does: with other values in
  it the conversion is byte-identical), repro-into-the-package-it-reproduces (with ``--force``
  the pack was written beside the package's files and replaced none, as documented),
  calibrate-bands-provenance-missing (a band row's provenance is optional; what was refused
  was the case's second fault, the default corpus too long for the package),
  bench-forward-a-black-box-engine (the default ``--prefix 64`` did not fit the package,
  refused clearly; with ``--prefix 4`` its row says "the engine decodes by itself: it runs no
  single forward", exit 0, as ``run`` leaves out an engine that cannot run),
  convert-fewer-layers-than-tensors (clear: "the weights hold 2 blocks (model.layers.N
  tensors)"; the needle ``model.layers.1`` was too strict), explain-engine-renamed-in-record
  (the record names the engine's class too, and explain used it); and
  calibrate-json-is-the-bands-file was refused first for its second fault (the default corpus).

The first six were removed, the last three corrected (the needle, the record's class cleared,
a small corpus): 81 of 101 clear (80.2%). Corrected, calibrate-json-is-the-bands-file names
the engine, never ``--json`` and ``--bands`` at one path: a lockstep fault too. The 20 faults
were left as strict xfail, each with its line.

The first run was on main 66ee55b, before the option, environment and evidence-file sweeps
(``test_sweep_*.py``) landed; run again after them, blind to each other, the same 20 failed:
the sweeps close whole kinds of input, the battery found faults between files and commands
(a build given where a checkpoint goes, a bench result where a record goes). All 20 are
fixed since, each with its case here as its test: 101 of 101 clear.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.test_bad_input_fifth import (  # noqa: E402
    GPUS, _band_row, _edit_manifest, _genai_build, _import_genai)
from suites.test_bad_input_fourth import (  # noqa: E402,F401  (bad, failing: fixtures)
    PLANTED, _chat_file, _explain, _failing_record, _gguf_env, _llama_cpp, _llama_server,
    bad, failing)
from suites.test_bad_input_fresh import (  # noqa: E402,F401  (intact, materials: fixtures)
    BASE, TINY, Case, Materials, _calibrate, _copy, _corpus, _manifest, _mp_file, _mp_metadata,
    _prompts, _record, _record_path, _run, _write, intact, materials, new_ids, run_case)
from suites.test_bad_input_third import (  # noqa: E402
    BENCH, SPEC, _bands, _hf_config, _package, _segment)

REPO = Path(__file__).resolve().parents[1]
HTTP = ["run", "--packages", "tiny_llama", "--engines", "http:openai=http://127.0.0.1:9",
        "--no-evidence"]
CUDA = ["run", "--packages", "tiny_llama", "--engines", "native-cuda", "--no-evidence"]
STALE = "sha256:" + "0" * 64  # a well-formed content hash of no package


def _record_copy(m: Materials, name: str = "run.json") -> Path:
    """The evidence record copied under a plain name of the user's."""
    return Path(shutil.copyfile(_record_path(m), m.tmp / name))


def _marked(m: Materials, name: str, marker: str) -> Path:
    """A JSON file as a lockstep command writes it (its marker in the first bytes)."""
    return _write(m.tmp / name, "{" + marker + ', "rows": []}\n')


def _bench_json(m: Materials) -> Path:
    from harness.bench import MARKER

    return _marked(m, "bench.json", MARKER)


def _lookup(**changes) -> dict:
    """A prompt-lookup speculative section for the converted package, with ``changes``."""
    return {"kind": "prompt-lookup", "target": "target", "max_width": 4, "max_ngram": 3,
            "min_ngram": 1, "rollback": ["k0", "v0", "k1", "v1"], "snapshot": [], **changes}


def _speculative(section: dict) -> Callable[[dict], None]:
    return lambda d: d["decoding"].update(speculative=section)


def _reference(m: Materials, folder: str, content_hash: str) -> list[str]:
    """The converted package declaring a reference; a copy of it stands beside as ``twin``."""
    _copy(m.package, m.tmp / "twin")
    return _package(m, lambda d: d.update(reference={"folder": folder,
                                                     "content_hash": content_hash}))


def _foreign_graph(m: Materials) -> list[str]:
    """The converted package whose target.onnx was replaced by another model's (tiny_llama)."""
    from harness.catalog import builtin

    folder = _copy(m.package, m.tmp / "pkg")
    shutil.copyfile(Path(builtin.build("tiny_llama")) / "target.onnx", folder / "target.onnx")
    return ["run", "--packages", str(folder), *BASE]


def _empty_second_shard(m: Materials) -> list[str]:
    """The HF folder sharded in two with an index, the second shard's download cut at 0
    bytes."""
    from safetensors.numpy import load_file, save_file

    folder = _copy(m.hf, m.tmp / "hf")
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    tail = {"model.norm.weight": tensors.pop("model.norm.weight")}
    save_file(tensors, str(folder / first))
    save_file(tail, str(folder / second))
    _write(folder / "model.safetensors.index.json", json.dumps(
        {"metadata": {}, "weight_map": {**dict.fromkeys(tensors, first),
                                        **dict.fromkeys(tail, second)}}))
    (folder / second).write_bytes(b"")
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _mp_run(m: Materials, change: Callable[[dict], None]) -> list[str]:
    """The onnx-genai model package, its cpu-rope metadata edited, given to ``run``."""
    _mp_metadata(m, change)
    return ["run", "--packages", str(m.tmp / "mp"), *BASE]


def _half(path: Path) -> bytes:
    raw = path.read_bytes()
    return raw[:len(raw) // 2]


def _truncated_build(m: Materials) -> list[str]:
    build = _genai_build(m)
    (build / "model.onnx").write_bytes(_half(build / "model.onnx"))
    return ["import-genai", str(build), "-o", str(m.tmp / "o")]


def _swapped_report(m: Materials) -> list[str]:
    from reports.render import MARKER

    _write(m.tmp / "r.html", f"<html><head>{MARKER}</head>yesterday's report</html>")
    return ["report", str(m.tmp / "r.html"), "-o", str(_copy(m.evidence, m.tmp / "ev"))]


def _bands_copy(m: Materials) -> Path:
    from engines.tolerances import BANDS_FILE

    return Path(shutil.copyfile(BANDS_FILE, m.tmp / "quantized_bands.json"))


def _earlier_run(m: Materials) -> list[str]:
    folder = _copy(m.evidence, m.tmp / "ev")
    return ["run", "--packages", str(m.package), *BASE[:-1], "--evidence-dir", str(folder)]


def _earlier_bench(m: Materials) -> list[str]:
    return ["bench", *BENCH, "--repeats", "1", "--max-new-tokens", "4", "--json",
            str(_bench_json(m))]


def _earlier_forward_bench(m: Materials) -> list[str]:
    from harness.forward_bench import MARKER

    return ["bench-forward", *BENCH, "--rows", "1,2", "--prefix", "4", "--repeats", "1",
            "--json", str(_marked(m, "forward.json", MARKER))]


def _first_json(folder: str) -> Callable[[Materials], Path]:
    return lambda m: next((m.tmp / folder).glob("*.json"))


# lockstep's faults found by the first run, left for a later fix: strict xfail, with why
LEFT: dict[str, str] = {
}

CASES = [
    # run: option values and combinations a new user types
    Case("run-max-new-tokens-with-unit", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native-host", "--no-evidence",
        "--max-new-tokens", "1k"], ("--max-new-tokens", "1k")),
    Case("run-shard-in-words", lambda m: [*TINY, "--shard", "1of2"], ("--shard", "1of2")),
    Case("run-width-negative", lambda m: [*SPEC, "--width", "-1"], ("--width", "-1")),
    Case("run-width-a-range", lambda m: [*SPEC, "--width", "1-3"], ("--width", "1-3")),
    Case("run-devices-a-range", lambda m: [*TINY, "--devices", "0-1"], ("--devices", "0-1"),
         env=GPUS),
    Case("run-engines-the-oracle", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "oracle", "--no-evidence"],
         ("--engines", "oracle")),
    Case("run-oracle-engine-a-black-box", lambda m: [*TINY, "--oracle-engine", "llama-cpp"],
         ("--oracle-engine", "llama-cpp")),
    Case("run-oracle-engine-a-server", lambda m: [
        *TINY, "--oracle-engine", "http:openai=http://127.0.0.1:9"], ("--oracle-engine",)),
    Case("run-prompts-set-misspelt", lambda m: _run(m, "--prompts", "grounde"),
         ("--prompts", "grounde")),
    Case("run-concurrency-with-devices", lambda m: [
        *HTTP, "--devices", "0", "--concurrency", "2"], ("--concurrency", "--devices"),
         env=GPUS),
    Case("run-packages-a-genai-build", lambda m: [
        "run", "--packages", str(_genai_build(m)), *BASE], ("--packages", "import-genai")),
    Case("run-model-package-io-key-unknown", lambda m: _mp_run(
        m, lambda d: d["model"]["io"].update(kv_layout="bnsh")),
         ("inference_metadata.yaml", "kv_layout")),

    # run: prompt files
    Case("prompts-a-json-array", lambda m: _prompts(
        m, '[\n  {"text": "a"},\n  {"text": "b"}\n]\n', "prompts.json"), ("prompts.json:1",)),
    Case("prompts-name-key-misspelt", lambda m: _prompts(m, '{"ids": [5, 6], "nmae": "x"}\n'),
         ("prompts.jsonl:1", "nmae")),
    Case("prompts-text-a-list", lambda m: _prompts(m, '{"text": ["hello", "world"]}\n'),
         ("prompts.jsonl:1", "text")),
    Case("prompts-key-repeated", lambda m: _prompts(m, '{"text": "a", "text": "b"}\n'),
         ("prompts.jsonl:1", "text")),
    Case("prompts-line-number-after-a-blank-line", lambda m: _prompts(
        m, '{"text": "a"}\n\n{"ids": "x"}\n'), ("prompts.jsonl:3",)),
    Case("prompts-an-evidence-record", lambda m: _run(m, "--prompts", str(_record_copy(m))),
         ("run.json:1",)),
    Case("prompts-openai-messages", lambda m: _chat_file(
        m, '{"messages": [{"role": "user", "content": "hi"}]}'), ("chat.jsonl:1", "messages")),
    Case("prompts-chat-content-empty", lambda m: _chat_file(
        m, '{"chat": [{"role": "user", "content": ""}]}'), ("chat.jsonl:1", "content")),

    # run: package.yaml and the package's files
    Case("package-format-a-string", lambda m: _package(m, lambda d: d.update(format="1")),
         ("format", "1")),
    Case("package-prompts-negative-id", lambda m: _package(
        m, lambda d: d.update(prompts=[[1, -5]])), ("prompts", "-5")),
    Case("package-state-dtype-disagrees-with-graph", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(dtype="float16")), ("k0", "float16")),
    Case("package-state-output-unknown", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(output="present_key_9")), ("present_key_9",)),
    Case("package-two-cells-one-input", lambda m: _package(
        m, lambda d: d["state"]["v0"].update(input="past_key_0")), ("past_key_0",)),
    Case("package-hidden-output-misspelt", lambda m: _package(
        m, lambda d: d["components"]["target"]["outputs"].update(hidden="hiddn")),
         ("hiddn",)),
    Case("package-append-cell-starts-non-empty", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(shape=[1, 1, 5, 32])), ("k0", "shape")),
    Case("package-prompt-lookup-min-ngram-above-max", lambda m: _package(
        m, _speculative(_lookup(max_ngram=1, min_ngram=3))), ("min_ngram", "3")),
    Case("package-prompt-lookup-max-width-zero", lambda m: _package(
        m, _speculative(_lookup(max_width=0))), ("max_width", "0")),
    Case("package-prompt-lookup-rollback-unknown-cell", lambda m: _package(
        m, _speculative(_lookup(rollback=["k0", "k9"]))), ("rollback", "k9")),
    Case("package-draft-proposer-missing", lambda m: _package(m, _speculative(
        {"kind": "draft", "proposer": "drafter", "target": "target", "max_width": 2})),
         ("drafter",)),
    Case("package-reference-hash-stale", lambda m: _reference(m, "twin", STALE),
         ("reference.content_hash",)),
    Case("package-reference-folder-a-path", lambda m: _reference(m, "../twin", STALE),
         ("reference.folder", "../twin")),
    Case("package-graph-of-another-model", _foreign_graph, ("target.onnx",)),

    # convert: Hugging Face folders, options, and folders of other tools
    Case("convert-llama-with-sliding-window", lambda m: _hf_config(m, sliding_window=16),
         ("sliding_window", "16")),
    Case("convert-gptq-checkpoint", lambda m: _hf_config(
        m, quantization_config={"quant_method": "gptq", "bits": 4}),
         ("quantization_config", "gptq")),
    Case("convert-rope-parameters-yarn", lambda m: _hf_config(
        m, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 50000.0}),
         ("rope_parameters", "yarn")),
    Case("convert-fewer-layers-than-tensors", lambda m: _hf_config(m, num_hidden_layers=1),
         ("num_hidden_layers", "model.layers")),
    Case("convert-second-shard-empty", _empty_second_shard,
         ("model-00002-of-00002.safetensors",)),
    Case("convert-prompt-lookup-past-16", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--prompt-lookup", "17"],
         ("--prompt-lookup", "17")),
    Case("convert-prompt-lookup-with-draft-layers", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--prompt-lookup", "4",
        "--draft-layers", "1"], ("--prompt-lookup", "--draft-layers")),
    Case("convert-genai-builder-with-prompt-lookup", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--builder", "onnxruntime-genai",
        "--prompt-lookup", "4"], ("--prompt-lookup", "--builder")),
    Case("convert-smollm2-misspelt", lambda m: ["convert", "smolm2", "-o", str(m.tmp / "out")],
         ("CHECKPOINT", "smolm2")),
    Case("convert-a-genai-build", lambda m: [
        "convert", str(_genai_build(m)), "-o", str(m.tmp / "out")], ("import-genai",)),
    Case("convert-a-model-package", lambda m: [
        "convert", str(m.model_package), "-o", str(m.tmp / "out")], ("import-package",)),

    # report: records and manifests edited by hand, options, swapped arguments
    Case("report-record-created-in-the-future", lambda m: _record(
        m, lambda d: d.update(created="2099-01-01T00:00:00Z")), ("created", "2099")),
    Case("report-record-defects-without-findings", lambda m: _record(
        m, lambda d: d["judgement"].update(defects=3)), ("defects", "3")),
    Case("report-record-width-zero", lambda m: _record(
        m, lambda d: d["mode"].update(kind="chained", width=0)), ("width", "0")),
    Case("report-manifest-started-not-a-date", lambda m: _manifest(
        m, _edit_manifest(lambda d: d.update(started="yesterday"))), ("started", "yesterday")),
    Case("report-manifest-left-out-a-string", lambda m: _manifest(
        m, _edit_manifest(lambda d: d.update(left_out="none"))), ("left_out", "none")),
    Case("report-baseline-is-the-evidence", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--baseline",
        str(m.evidence)], ("--baseline",)),
    Case("report-baseline-record-not-json", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--baseline",
        str(_write(_copy(m.evidence, m.tmp / "base") / "bad.json", "{nope").parent)],
         ("bad.json",)),
    Case("report-bench-an-evidence-record", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--bench",
        str(_record_copy(m))], ("--bench", "run.json")),
    Case("report-catch-matrix-the-markdown", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--catch-matrix",
        str(REPO / "docs" / "CATCH_MATRIX.md")], ("--catch-matrix", "CATCH_MATRIX.md")),
    Case("report-a-package-folder", lambda m: [
        "report", str(m.package), "-o", str(m.tmp / "r.html")], ("EVIDENCE_DIR",)),
    Case("report-arguments-swapped", _swapped_report, ("EVIDENCE_DIR", "r.html"),
         kept=_first_json("ev")),
    Case("report-output-is-a-bench-json", lambda m: [
        "report", str(m.evidence), "-o", str(_bench_json(m))], ("-o",),
         kept=lambda m: m.tmp / "bench.json"),

    # explain and repro on a failing record
    Case("explain-record-package-changed", lambda m: [
        "explain", str(_failing_record(m, lambda d: d["package"].update(
            content_hash=STALE))), "--engine", PLANTED], ("content_hash",)),
    Case("explain-engine-module-missing", lambda m: [
        "explain", str(m.failing), "--engine", "no_such_mod:Engine"],
         ("--engine", "no_such_mod")),
    Case("explain-record-half-downloaded", lambda m: [
        "explain", str(_write(m.tmp / "cut.json", _half(m.failing)))], ("cut.json",)),
    Case("explain-engine-renamed-in-record", lambda m: [
        "explain", str(_failing_record(m, lambda d: d.update(engine="native-hots",
                                                             engine_class=None)))],
         ("native-hots", "--engine")),
    Case("explain-plot-to-stdout", lambda m: _explain(m, "--plot", "-"), ("--plot",)),
    Case("explain-a-bench-json", lambda m: ["explain", str(_bench_json(m))],
         ("EVIDENCE_FILE", "bench.json")),
    Case("repro-no-shrink-with-max-runs", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "-o", str(m.tmp / "pack"), "--no-shrink",
        "--max-runs", "5"], ("--max-runs", "--no-shrink")),

    # calibrate
    Case("calibrate-json-is-the-bands-file", lambda m: _calibrate(
        m, "--corpus", _corpus(m, _segment(), ("a.txt", "hello world"))[-1], "--write",
        "--bands", str(m.tmp / "b.json"), "--json", str(m.tmp / "b.json")),
         ("--json", "--bands")),
    Case("calibrate-corpus-segment-extra-key", lambda m: _corpus(
        m, _segment(weight=2), ("a.txt", "hello")), ("segments[0]", "weight")),
    Case("calibrate-bands-window-zero", lambda m: _bands(m, _band_row(window=0)),
         ("window", "0")),
    Case("calibrate-package-a-gguf", lambda m: [
        "calibrate", "--engine", "llama-cpp", "--package", str(m.package.parent / "tiny.gguf"),
        "--corpus", _corpus(m, _segment(), ("a.txt", "hello world"))[-1]],
         ("--package", "tiny.gguf")),
    Case("calibrate-engine-and-package-swapped", lambda m: [
        "calibrate", "--engine", "tiny_llama", "--package", "llama-cpp"],
         ("--engine", "tiny_llama")),
    Case("calibrate-json-over-the-bands-table", lambda m: _calibrate(
        m, "--json", str(_bands_copy(m))), ("--json",),
         kept=lambda m: m.tmp / "quantized_bands.json"),
    Case("calibrate-corpus-a-prompts-file", lambda m: _calibrate(
        m, "--corpus", str(_write(m.tmp / "prompts.jsonl", '{"text": "a"}\n{"text": "b"}\n'))),
         ("prompts.jsonl",)),

    # the benches
    Case("bench-baseline-an-evidence-folder", lambda m: [
        "bench", *BENCH, "--baseline", str(m.evidence)], ("--baseline",)),
    Case("bench-prompts-set-misspelt", lambda m: [
        "bench", *BENCH, "--prompts", "grounded,fre"], ("--prompts", "fre")),
    Case("bench-json-is-its-prompts-file", lambda m: [
        "bench", *BENCH, "--prompts", str(_write(m.tmp / "p.jsonl", '{"ids": [1, 2, 3]}\n')),
        "--json", str(m.tmp / "p.jsonl")], ("--json",), kept=lambda m: m.tmp / "p.jsonl"),
    Case("bench-forward-without-engines", lambda m: [
        "bench-forward", "--packages", "tiny_llama"], ("--engines",)),
    Case("bench-judge-lengths-with-unit", lambda m: [
        "bench-judge", *BENCH, "--lengths", "1k,2k"], ("--lengths", "1k")),

    # the importers
    Case("import-genai-eos-past-vocab", lambda m: _import_genai(
        m, lambda c: c["model"].update(eos_token_id=[99])), ("eos_token_id", "99")),
    Case("import-genai-head-size-zero", lambda m: _import_genai(
        m, lambda c: c["model"]["decoder"].update(head_size=0)), ("head_size", "0")),
    Case("import-genai-past-key-names-without-index", lambda m: _import_genai(
        m, lambda c: c["model"]["decoder"]["inputs"].update(
            past_key_names="past_key_values.key")), ("past_key_names",)),
    Case("import-genai-output-is-the-build", lambda m: [
        "import-genai", str(_genai_build(m)), "-o", str(m.tmp / "build"), "--force"], ("-o",),
         kept=lambda m: m.tmp / "build" / "model.onnx"),
    Case("import-genai-prompts-from-another-tokenizer", lambda m: [
        "import-genai", str(_genai_build(m)), "--prompts-from", "tiny_llama", "-o",
        str(m.tmp / "o")], ("--prompts-from", "tiny_llama")),
    Case("import-genai-a-hugging-face-folder", lambda m: [
        "import-genai", str(m.hf), "-o", str(m.tmp / "o")], ("genai_config.json", "convert")),
    Case("import-genai-model-half-downloaded", _truncated_build, ("model.onnx",)),
    Case("import-genai-arguments-swapped", lambda m: [
        "import-genai", str(m.tmp / "genai-package"), "-o", str(_genai_build(m)), "--force"],
         ("genai-package",), kept=lambda m: m.tmp / "build" / "genai_config.json"),
    Case("import-package-io-key-unknown", lambda m: _mp_metadata(
        m, lambda d: d["model"]["io"].update(kv_layout="bnsh")), ("kv_layout",)),
    Case("import-package-fewer-cache-outputs", lambda m: _mp_metadata(
        m, lambda d: d["model"]["io"]["static_cache"]["key_cache_outputs"].pop()),
         ("key_cache_outputs",)),
    Case("import-package-genai-config-eos-a-string", lambda m: _mp_file(
        m, "cpu-rope/genai_config.json", json.dumps({"model": {
            "bos_token_id": 2, "eos_token_id": "3", "context_length": 24, "vocab_size": 32}})),
         ("genai_config.json", "eos_token_id")),
    Case("import-package-model-half-downloaded", lambda m: _mp_file(
        m, "cpu-rope/model.onnx", _half(m.model_package / "cpu-rope" / "model.onnx")),
         ("model.onnx",)),
    Case("import-package-a-lockstep-package", lambda m: [
        "import-package", str(m.package), "-o", str(m.tmp / "o")], ("manifest.json",)),

    # cache, claims and the command line itself
    Case("cache-list-with-a-prune-option", lambda m: ["cache", "list", "--older-than", "3"],
         ("--older-than",), env={"LOCKSTEP_CACHE": lambda m: str(m.tmp / "cache")}),
    Case("help-as-a-command", lambda m: ["help", "run"], ("help",)),
    Case("claims-tests-of-one-claim", lambda m: ["claims", "--tests", "token_identity"],
         ("token_identity",)),

    # environment variables
    Case("env-http-timeout-with-unit", lambda m: HTTP, ("LOCKSTEP_HTTP_TIMEOUT", "30s"),
         env={"LOCKSTEP_HTTP_TIMEOUT": "30s"}),
    Case("env-http-startup-timeout-zero", _llama_server,
         ("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "0"),
         env={"LOCKSTEP_HTTP_STARTUP_TIMEOUT": "0", "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    Case("env-llama-threads-decimal", _llama_cpp, ("LOCKSTEP_LLAMA_THREADS", "1.5"),
         env={"LOCKSTEP_LLAMA_THREADS": "1.5", "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    Case("env-llama-server-not-on-path", _llama_server,
         ("LOCKSTEP_LLAMA_SERVER", "no-such-llama-server"),
         env={"LOCKSTEP_LLAMA_SERVER": "no-such-llama-server",
              "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    Case("env-gpu-count-decimal", lambda m: [*TINY, "--devices", "0"],
         ("LOCKSTEP_GPU_COUNT", "1.5"), env={"LOCKSTEP_GPU_COUNT": "1.5"}),
    Case("env-dependent-launch-quoted", lambda m: CUDA, ("LOCKSTEP_DEPENDENT_LAUNCH", '"off"'),
         env={"LOCKSTEP_DEPENDENT_LAUNCH": '"off"'}),  # as an env file quotes it

    # Ctrl-C in the middle of work beside what the user had
    Case("interrupt-run-into-an-earlier-run", _earlier_run, ("interrupted",),
         kept=_first_json("ev"), status=130, interrupt="harness.cell_runner:decode"),
    Case("interrupt-bench-over-an-earlier-bench-json", _earlier_bench, ("interrupted",),
         kept=lambda m: m.tmp / "bench.json", status=130,
         interrupt="harness.bench:timed_decode"),
    Case("interrupt-bench-forward-over-an-earlier-json", _earlier_forward_bench,
         ("interrupted",), kept=lambda m: m.tmp / "forward.json", status=130,
         interrupt="harness.forward_bench:_time_forward"),
]


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=LEFT[c.id])]
                 if c.id in LEFT else []) for c in CASES])
def test_sixth_bad_input_ends_in_one_clear_line(case, bad, capsys, monkeypatch):
    run_case(case, bad, capsys, monkeypatch)


def test_the_cases_are_new():
    """No case repeats an id of the earlier batteries, and every fault left names a case."""
    from suites import (test_bad_input_battery, test_bad_input_fifth, test_bad_input_fourth,
                        test_bad_input_fresh, test_bad_input_third)

    assert new_ids(CASES, test_bad_input_battery, test_bad_input_fresh, test_bad_input_third,
                   test_bad_input_fourth, test_bad_input_fifth)
    assert set(LEFT) <= {c.id for c in CASES}
