"""A fifth battery of bad inputs (issue 33's acceptance, measured on inputs no fix was driven
by): new options, combinations, damage and files beside those of the earlier batteries
(``test_bad_input_battery.py``, ``_fresh``, ``_third``, ``_fourth``) and the other
``test_bad_input_*.py``, across every command a user types, the files they read (prompt
files, package.yaml and its files, Hugging Face folders and GGUFs, evidence records and run
manifests, onnxruntime-genai builds and onnx-genai packages, the calibration corpus and bands
table), the environment variables lockstep reads, outputs that would land on the user's files,
and Ctrl-C.

The same notion of clear as the earlier batteries: the documented exit status (2 for bad
input, 130 for an interrupt), no traceback, one ``lockstep: error:`` line naming the field and
the value (the ``needles``) with a remedy (an interrupt: one ``lockstep: interrupted`` line),
the user's files untouched, within ``SECONDS``.

First run (main 5cb447b, before any fix, all 99 cases written before any was run): 74 of 99
clear (74.7%), 25 not:

- unclear, or refused without naming the field or with the wrong remedy (exit 2):
  run-packages-a-hugging-face-folder and run-packages-a-gguf (neither names ``--packages`` nor
  says ``lockstep convert``), package-chat-template-empty (blames the user's ``--chat`` text, its
  value a tuple's repr), report-the-runs-folder (tells the user to delete their run manifest),
  report-record-status-defect-without-findings (blames ``ok``, not the edited ``status``),
  calibrate-llama-cpp-on-a-fixture (``[field segments[0].file = 'tiny_llama']``),
  calibrate-corpus-key-misspelt (``segmnets`` not named; the value is the corpus path);
  clear by the earlier batteries' standard and failing only this one's needles:
  convert-pytorch-bin-only (the ``.bin`` file found is not named), convert-gguf-alignment-odd
  (``[field checkpoint]``, not ``general.alignment``), bench-width-past-max (``[field width]``,
  not ``--width``);
- a traceback: explain-plot-empty (``ValueError: PosixPath('.') has an empty name``);
- the wrong party blamed, exit 1: package-target-renamed (every cell an ``error``:
  ``oracle: KeyError: 'target'``);
- accepted (exit 0) although wrong: run-explain-without-evidence, convert-no-twin-at-float32,
  report-record-host-staging-negative, report-record-content-hash-malformed,
  report-record-prompt-ids-empty, report-manifest-finished-before-started;
- the case was wrong, not lockstep: report-record-speculative-without-width (a record's
  ``mode.kind`` is draft, chained or mtp, never ``speculative``: refused clearly),
  import-genai-context-length-word and import-genai-vocab-size-zero (the stand-in build had no
  ``present.*`` outputs, refused first and clearly), convert-draft-layers-every-layer (a
  drafter of every block is in the documented 1..layers range,
  ``test_layer_skip_drafter_with_every_block_is_the_target``), import-package-name-a-path
  (manifest names are mapped to folder names by design: ``_evil``), calibrate-bands-missing (a
  bands table that does not exist yet is allowed, for a scheme's first calibration; what was
  refused was a second real fault of the case, the default corpus too long for the package);
- the documentation was wrong, not lockstep: run-devices-with-oracle-engine followed
  docs/USAGE.md ("a moved oracle ... is refused" with ``--devices``), but the workers do judge
  by the moved oracle (``harness.distributed``, docs/ARCHITECTURE.md); USAGE.md is corrected.

The first three of those were corrected (a ``chained`` record, a build with its cache
outputs), the other four removed: 74 of 95 clear without them (77.9%). Corrected,
import-genai-context-length-word was a traceback (``ValueError``) and
import-genai-vocab-size-zero named the package lockstep had just written, not
genai_config.json (both now also require it): lockstep faults too.

Fixed, each with its case here as its test (95 of 95 clear): ``run`` refuses ``--explain``
with ``--no-evidence``; a GGUF or Hugging Face folder given as a package is named as a
checkpoint with ``lockstep convert`` as the remedy (``harness.packages``); a package needs a
``target`` component (``engines.package.schema``); a chat template that renders nothing is
named (``harness.prompts``); convert names the ``.bin`` files a folder holds instead of
safetensors, refuses ``--no-twin`` at float32 and names a GGUF's bad ``general.alignment``;
report names an evidence folder's ``runs/`` given in its place; a record's ledger counters
are non-negative, its content hash ``sha256:`` + 64 hex digits, its prompt non-empty, an
edited ``status`` named before the ``ok`` it changes, and a manifest may not finish before
it started; ``explain --plot ''`` is refused; calibrate refuses a package its engine does
not run (``supports``) and names what a corpus manifest holds instead of ``segments``;
bench names ``--width``; import-genai checks genai_config.json's counts before wrapping.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.test_bad_input_battery import _config_text, _gguf_meta  # noqa: E402
from suites.test_bad_input_fourth import (  # noqa: E402,F401  (bad, failing: fixtures)
    PLANTED, _chat_file, _explain, _failing_record, _gguf_env, _llama_server,
    _with_template, _yaml_text, bad, failing)
from suites.test_bad_input_fresh import (  # noqa: E402,F401  (intact, materials: fixtures)
    BASE, TINY, Case, Materials, _copy, _corpus, _manifest, _mp_file, _mp_metadata, _prompts, _record,
    _record_path, _run, _user_file, _write, intact, materials, new_ids, run_case)
from suites.test_bad_input_third import (  # noqa: E402
    BENCH, SPEC, _bands, _hf_config, _package, _segment)

GPUS = {"LOCKSTEP_GPU_COUNT": "2"}  # as if two GPUs were visible: --devices passes its count


def _hf_renamed(m: Materials, old: str, new: str) -> list[str]:
    """The HF folder with one file renamed, converted."""
    folder = _copy(m.hf, m.tmp / "hf")
    (folder / old).rename(folder / new)
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _renamed_target(doc: dict) -> None:
    doc["components"]["main"] = doc["components"].pop("target")
    for cell in doc["state"].values():
        cell["component"] = "main"


def _broken_yaml_link(m: Materials) -> list[str]:
    folder = _copy(m.package, m.tmp / "pkg")
    (folder / "package.yaml").unlink()
    (folder / "package.yaml").symlink_to(m.tmp / "nowhere.yaml")
    return ["run", "--packages", str(folder), *BASE]


def _empty_template(m: Materials) -> list[str]:
    from engines.tokenizer import CHAT_TEMPLATE_FILE

    argv = _with_template(m, "--chat", "hi")
    _write(m.tmp / "pkg" / CHAT_TEMPLATE_FILE, "")
    return argv


def _edit_manifest(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return edit


def _genai_build(m: Materials, change: Callable[[dict], None] | None = None) -> Path:
    """onnxruntime-genai's stand-in build (``suites.test_import_genai.tiny_build``), its
    genai_config.json edited."""
    from suites.test_import_genai import CONFIG, tiny_build

    config = copy.deepcopy(CONFIG)
    if change is not None:
        change(config)
    return tiny_build(m.tmp / "build", config, ("logits", "present.0.key", "present.0.value"))


def _import_genai(m: Materials, change: Callable[[dict], None]) -> list[str]:
    return ["import-genai", str(_genai_build(m, change)), "-o", str(m.tmp / "o")]


def _previous_genai_import(m: Materials) -> list[str]:
    _write(m.tmp / "o" / "package.yaml", "an earlier import\n")
    return ["import-genai", str(_genai_build(m)), "-o", str(m.tmp / "o"), "--force"]


def _previous_explanation(m) -> list[str]:
    from harness.forensics.explanation import MARKER

    _write(m.tmp / "why.json", "{" + MARKER + ', "what": "yesterday\'s explanation"}\n')
    return _explain(m, "--json", str(m.tmp / "why.json"))


def _band_row(**changes) -> str:
    """A bands table of the checked-in q4_0 row with ``changes``."""
    from engines.tolerances import BANDS_FILE

    row = json.loads(BANDS_FILE.read_text())["schemes"]["ggml-cpu:q4_0"]
    return json.dumps({"schemes": {"ggml-cpu:q4_0": {**row, **changes}}})




LEFT: set[str] = set()  # unclear today, left for a later fix (the docstring says why)

CASES = [
    # run: option values and combinations a new user types
    Case("run-mode-abbreviated", lambda m: [*TINY, "--mode", "spec"], ("--mode", "spec")),
    Case("run-oracle-mode-capitalised", lambda m: [*TINY, "--oracle-mode", "Stream"],
         ("--oracle-mode", "Stream")),
    Case("run-width-zero", lambda m: [*SPEC, "--width", "0"], ("--width", "0")),
    Case("run-concurrency-zero", lambda m: [*TINY, "--concurrency", "0"],
         ("--concurrency", "0")),
    Case("run-shard-negative", lambda m: [*TINY, "--shard", "-1/2"], ("--shard",)),
    Case("run-explain-without-evidence", lambda m: [*TINY, "--explain"],
         ("--explain", "--no-evidence")),
    Case("run-devices-with-text", lambda m: _run(m, "--devices", "0", "--text", "hello"),
         ("--devices", "--text"), env=GPUS),
    Case("run-text-past-context", lambda m: _run(m, "--text", "hello world " * 20),
         ("--text",)),
    Case("run-packages-a-hugging-face-folder", lambda m: [
        "run", "--packages", str(m.hf), *BASE], ("--packages", "lockstep convert")),
    Case("run-packages-a-gguf", lambda m: [
        "run", "--packages", str(m.package.parent / "tiny.gguf"), *BASE],
         ("tiny.gguf", "lockstep convert")),
    Case("run-engines-http-url-without-scheme", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "http:openai=127.0.0.1:8000",
        "--no-evidence"], ("--engines", "127.0.0.1:8000")),
    Case("run-engines-space-separated", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native-host ort-cpu",
        "--no-evidence"], ("--engines", "native-host ort-cpu")),
    Case("run-packages-space-separated", lambda m: [
        "run", "--packages", "tiny_llama", "tied_llama", "--engines", "native-host",
        "--no-evidence"], ("tied_llama",)),

    # run: prompt files
    Case("prompts-pretty-printed-object", lambda m: _prompts(m, '{\n  "text": "hello"\n}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-latin1", lambda m: _prompts(m, '{"text": "caf\u00e9"}\n'.encode("latin-1")),
         ("prompts.jsonl",)),
    Case("prompts-ids-as-strings", lambda m: _prompts(m, '{"ids": ["1", "2"]}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-ids-past-vocab", lambda m: _prompts(m, '{"ids": [1, 99999]}\n'),
         ("prompts.jsonl:1", "99999")),
    Case("prompts-chat-role-capitalised", lambda m: _chat_file(
        m, '{"chat": [{"role": "User", "content": "hi"}]}'), ("chat.jsonl:1", "User")),
    Case("prompts-chat-role-missing", lambda m: _chat_file(
        m, '{"chat": [{"content": "hi"}]}'), ("chat.jsonl:1", "role")),

    # run: package.yaml and the package's files
    Case("package-dtype-fp32", lambda m: _package(m, lambda d: d.update(dtype="fp32")),
         ("dtype", "fp32")),
    Case("package-target-renamed", lambda m: _package(m, _renamed_target),
         ("components", "target")),
    Case("package-seq-axis-negative", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(seq_axis=-1)), ("seq_axis", "-1")),
    Case("package-state-shape-disagrees-with-graph", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(shape=[1, 1, 0, 16])), ("k0", "shape")),
    Case("package-state-input-unknown", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(input="past_key_9")), ("past_key_9",)),
    Case("package-state-cell-missing", lambda m: _package(
        m, lambda d: d["state"].pop("v1") and None), ("past_value_1",)),
    Case("package-prompts-a-fractional-id", lambda m: _package(
        m, lambda d: d.update(prompts=[[1, 2, 3.5]])), ("prompts",)),
    Case("package-speculative-empty-mapping", lambda m: _package(
        m, lambda d: d["decoding"].update(speculative={})), ("speculative",)),
    Case("package-input-role-unknown", lambda m: _package(
        m, lambda d: d["components"]["target"]["inputs"].update(
            attention_mask="attention_mask")), ("attention_mask",)),
    Case("package-static-update-on-a-growing-cell", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(update="static")), ("k0", "static")),
    Case("package-yaml-tab-indented", lambda m: _yaml_text(
        m, lambda t: t.replace("\n  target:", "\n\ttarget:")), ("package.yaml",)),
    Case("package-yaml-broken-link", _broken_yaml_link, ("package.yaml",)),
    Case("package-chat-template-empty", _empty_template, ("chat_template.jinja",)),

    # convert: Hugging Face folders, GGUFs, options
    Case("convert-pytorch-bin-only", lambda m: _hf_renamed(
        m, "model.safetensors", "pytorch_model.bin"), ("pytorch_model.bin",)),
    Case("convert-config-trailing-comma", lambda m: _config_text(
        m, (m.hf / "config.json").read_text().rstrip()[:-1] + ",}"), ("config.json",)),
    Case("convert-rope-scaling-dynamic", lambda m: _hf_config(
        m, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), ("rope_scaling", "dynamic")),
    Case("convert-partial-rotary-factor-half", lambda m: _hf_config(
        m, partial_rotary_factor=0.5), ("partial_rotary_factor", "0.5")),
    Case("convert-qwen2-use-sliding-window", lambda m: _hf_config(
        m, architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=8),
         ("use_sliding_window",)),
    Case("convert-mixtral-experts-per-token-above-experts", lambda m: _hf_config(
        m, architectures=["MixtralForCausalLM"], num_local_experts=2, num_experts_per_tok=3),
         ("num_experts_per_tok", "3")),
    Case("convert-no-twin-at-float32", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--no-twin"], ("--no-twin",)),
    Case("convert-output-under-a-file", lambda m: [
        "convert", str(m.hf), "-o", str(_user_file(m, "notes.txt") / "pkg")], ("-o",),
         kept=lambda m: m.tmp / "notes.txt"),
    Case("convert-output-empty", lambda m: ["convert", str(m.hf), "-o", ""], ("-o",)),
    Case("convert-dtype-fp16", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--dtype", "fp16"], ("--dtype", "fp16")),
    Case("convert-cache-paged", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--cache", "paged"],
         ("--cache", "paged")),
    Case("convert-builder-genai", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--builder", "genai"],
         ("--builder", "genai")),
    Case("convert-gguf-tokenizer-model-unknown", lambda m: _gguf_meta(
        m, "tokenizer.ggml.model", "wordpiece9"), ("tokenizer.ggml.model",)),
    Case("convert-gguf-alignment-odd", lambda m: _gguf_meta(m, "general.alignment", 7),
         ("general.alignment",)),
    Case("convert-without-checkpoint", lambda m: ["convert"], ("CHECKPOINT",)),

    # report: evidence records and run manifests edited by hand, options
    Case("report-the-runs-folder", lambda m: [
        "report", str(m.evidence / "runs"), "-o", str(m.tmp / "r.html")],
         ("EVIDENCE_DIR", "runs")),
    Case("report-without-evidence-dir", lambda m: ["report"], ("EVIDENCE_DIR",)),
    Case("report-record-verdict-unknown", lambda m: _record(
        m, lambda d: d["verdicts"].update(token_identity="maybe")), ("verdicts", "maybe")),
    Case("report-record-host-staging-negative", lambda m: _record(
        m, lambda d: d["ledger"].update(host_staging=-1)), ("host_staging", "-1")),
    Case("report-record-content-hash-malformed", lambda m: _record(
        m, lambda d: d["package"].update(content_hash="abc")), ("content_hash", "abc")),
    Case("report-record-speculative-without-width", lambda m: _record(
        m, lambda d: d["mode"].update(kind="chained", width=None)), ("width",)),
    Case("report-record-status-defect-without-findings", lambda m: _record(
        m, lambda d: d.update(status="defect")), ("status", "defect")),
    Case("report-record-engine-empty", lambda m: _record(m, lambda d: d.update(engine="")),
         ("engine",)),
    Case("report-record-wall-seconds-a-word", lambda m: _record(
        m, lambda d: d["timings"].update(wall_s="fast")), ("wall_s",)),
    Case("report-record-prompt-ids-empty", lambda m: _record(
        m, lambda d: d["prompt"].update(ids=[])), ("ids",)),
    Case("report-manifest-finished-before-started", lambda m: _manifest(
        m, _edit_manifest(lambda d: d.update(finished="2000-01-01T00:00:00Z"))),
         ("finished",)),
    Case("report-manifest-shard-malformed", lambda m: _manifest(
        m, _edit_manifest(lambda d: d.update(shard="3/2"))), ("shard",)),
    Case("report-bench-without-a-file", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--bench"], ("--bench",)),
    Case("report-catch-matrix-and-no-catch-matrix", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--catch-matrix",
        str(_write(m.tmp / "c.json", "{}")), "--no-catch-matrix"],
         ("--catch-matrix", "--no-catch-matrix")),

    # explain and repro on a failing record
    Case("explain-plot-empty", lambda m: _explain(m, "--plot", ""), ("--plot",)),
    Case("explain-package-a-gguf", lambda m: _explain(
        m, "--package", str(m.package.parent / "tiny.gguf")), ("--package", "tiny.gguf")),
    Case("explain-json-is-the-record", lambda m: [
        "explain", str(_failing_record(m, lambda d: None)), "--engine", PLANTED, "--json",
        str(m.tmp / m.failing.name)], ("--json",), kept=lambda m: m.tmp / m.failing.name),
    Case("explain-two-records", lambda m: ["explain", str(m.failing), str(_record_path(m))],
         ("native-host__greedy",)),
    Case("repro-into-the-evidence-folder", lambda m: [
        "repro", str(_copy(m.failing.parent, m.tmp / "ev") / m.failing.name), "--engine",
        PLANTED, "-o", str(m.tmp / "ev")], ("-o",),
         kept=lambda m: m.tmp / "ev" / m.failing.name),
    Case("repro-another-registered-engine", lambda m: [
        "repro", str(m.failing), "--engine", "native-host", "-o", str(m.tmp / "pack")],
         ("--engine", "native-host")),
    Case("repro-package-moved", lambda m: [
        "repro", str(_failing_record(m, lambda d: d["package"].update(
            path=str(m.tmp / "moved")))), "--engine", PLANTED, "-o", str(m.tmp / "pack")],
         ("--package",)),
    Case("repro-without-output", lambda m: ["repro", str(m.failing), "--engine", PLANTED],
         ("-o",)),

    # calibrate
    Case("calibrate-engines-plural", lambda m: ["calibrate", "--engines", "llama-cpp"],
         ("--engines",)),
    Case("calibrate-llama-cpp-on-a-fixture", lambda m: [
        "calibrate", "--engine", "llama-cpp", "--package", "tiny_llama", "--corpus",
        _corpus(m, _segment(), ("a.txt", "hello world"))[-1]], ("--package", "tiny_llama")),
    Case("calibrate-corpus-key-misspelt", lambda m: _corpus(
        m, _segment().replace("segments:", "segmnets:"), ("a.txt", "hello")), ("segmnets",)),
    Case("calibrate-bands-margin-negative", lambda m: _bands(m, _band_row(near_tie_margin=-1)),
         ("near_tie_margin", "-1")),
    Case("calibrate-bands-row-key-misspelt", lambda m: _bands(m, _band_row(
        near_tie_margn=1.3)), ("near_tie_margn",)),
    Case("bench-width-past-max", lambda m: [
        "bench", "--engines", "native-host", "--packages", "lookup_chained", "--mode",
        "speculative", "--width", "99"], ("--width", "99")),
    Case("bench-json-is-an-evidence-record", lambda m: [
        "bench", *BENCH, "--json", str(_copy(m.evidence, m.tmp / "ev") and
                                       next((m.tmp / "ev").glob("*.json")))], ("--json",),
         kept=lambda m: next((m.tmp / "ev").glob("*.json"))),
    Case("bench-forward-prefill-repeated", lambda m: [
        "bench-forward", *BENCH, "--prefill", "8,8"], ("--prefill", "8,8")),
    Case("bench-judge-json-a-user-file", lambda m: [
        "bench-judge", *BENCH, "--json", str(_user_file(m, "notes.json"))], ("--json",),
         kept=lambda m: m.tmp / "notes.json"),

    # the importers
    Case("import-genai-decoder-filename-escapes", lambda m: _import_genai(
        m, lambda c: c["model"]["decoder"].update(filename="../model.onnx")),
         ("filename", "../model.onnx")),
    Case("import-genai-context-length-word", lambda m: _import_genai(
        m, lambda c: c["model"].update(context_length="16k")),
         ("genai_config.json", "context_length", "16k")),
    Case("import-genai-layers-past-the-graph", lambda m: _import_genai(
        m, lambda c: c["model"]["decoder"].update(num_hidden_layers=2)),
         ("past_key_values.1.key",)),
    Case("import-genai-vocab-size-zero", lambda m: _import_genai(
        m, lambda c: c["model"].update(vocab_size=0)), ("genai_config.json", "vocab_size", "0")),
    Case("import-package-output-holds-user-files", lambda m: [
        "import-package", str(m.model_package), "-o",
        str(_user_file(m, "out/notes.txt").parent)], ("-o",),
         kept=lambda m: m.tmp / "out" / "notes.txt"),
    Case("import-package-metadata-vocab-size-zero", lambda m: _mp_metadata(
        m, lambda d: d["model"].update(vocab_size=0)), ("vocab_size", "0")),
    Case("import-package-token-input-unknown", lambda m: _mp_metadata(
        m, lambda d: d["model"]["io"].update(token_input="input_idz")), ("input_idz",)),
    Case("import-package-nxrt-info-not-json", lambda m: _mp_file(
        m, "cpu/nxrt_info.json", "{nope"), ("nxrt_info.json",)),

    # cache, fixtures and the command line itself
    Case("cache-list-json", lambda m: ["cache", "list", "--json"], ("--json",)),
    Case("fixtures-build-upper-case", lambda m: ["fixtures", "build", "TINY_LLAMA"],
         ("TINY_LLAMA",)),
    Case("global-option-unknown", lambda m: ["--verbose", "run"], ("--verbose",)),

    # environment variables
    Case("env-dependent-launch-misspelt", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native-cuda", "--no-evidence"],
         ("LOCKSTEP_DEPENDENT_LAUNCH", "maybe"), env={"LOCKSTEP_DEPENDENT_LAUNCH": "maybe"}),
    Case("env-native-cuda-graphs-always", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native-cuda", "--no-evidence"],
         ("LOCKSTEP_NATIVE_CUDA_GRAPHS", "always"),
         env={"LOCKSTEP_NATIVE_CUDA_GRAPHS": "always"}),
    Case("env-http-startup-timeout-inf", _llama_server,
         ("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "inf"), env={"LOCKSTEP_HTTP_STARTUP_TIMEOUT": "inf"}),
    Case("env-llama-server-a-command-line", _llama_server, ("LOCKSTEP_LLAMA_SERVER",),
         env={"LOCKSTEP_LLAMA_SERVER": "llama-server --port 8080",
              "LOCKSTEP_CHECKPOINTS": _gguf_env}),

    # Ctrl-C in the middle of work that replaces what the user had
    Case("interrupt-import-genai-over-an-earlier-import", _previous_genai_import,
         ("interrupted",), kept=lambda m: m.tmp / "o" / "package.yaml", status=130,
         interrupt="engines.backends.genai_package:wrap_genai_build"),
    Case("interrupt-explain-over-its-own-json", _previous_explanation, ("interrupted",),
         kept=lambda m: m.tmp / "why.json", status=130,
         interrupt="harness.forensics.explanation:Explanation.to_json"),
]


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason="left unclear")]
                 if c.id in LEFT else []) for c in CASES])
def test_fifth_bad_input_ends_in_one_clear_line(case, bad, capsys, monkeypatch):
    run_case(case, bad, capsys, monkeypatch)


def test_the_cases_are_new():
    """No case repeats an id of the earlier batteries."""
    from suites import (test_bad_input_battery, test_bad_input_fourth, test_bad_input_fresh,
                        test_bad_input_third)

    assert new_ids(CASES, test_bad_input_battery, test_bad_input_fresh, test_bad_input_third,
                   test_bad_input_fourth)
