"""A fourth battery of bad inputs (issue 33's acceptance, measured on inputs no fix was
driven by): new options, combinations, damage and files beside those of
``test_bad_input_battery.py``, ``test_bad_input_fresh.py``, ``test_bad_input_third.py`` and
the other ``test_bad_input_*.py``, across every command a user types, the files they read
(prompt files, package.yaml and its files, checkpoints, GGUF, evidence records and manifests,
onnx-genai packages, the calibration corpus and bands table), the environment variables
lockstep reads, outputs that would land on the user's files or nowhere, and Ctrl-C.

The same notion of clear as the fresh battery: the documented exit status (2 for bad input,
130 for an interrupt), no traceback, one ``lockstep: error:`` line naming the field and the
value (the ``needles``) with a remedy (an interrupt: one ``lockstep: interrupted`` line), the
user's files untouched, within ``SECONDS``.

First run (main 70318aa, before any fix, the cases written before any was run): 94 of 133
clear (70.7%), 39 not:

- unclear or refused without naming the field (exit 2): run-prompt-negative-id (``prompt[1]``,
  not ``--prompt``) and convert-a-folder-holding-a-gguf (the GGUF inside not named), both
  clear by the earlier batteries' standard and failing only this one's needles;
  convert-tensor-missing (names the graph's ``final_norm``, not ``model.norm.weight``),
  convert-tensor-extra-layer (advises ``num_hidden_layers: 6`` for a stray layer-5 tensor),
  report-baseline-empty-folder, explain-plot-under-proc, repro-output-under-proc,
  bench-json-under-proc (and only after the bench ran), repro-package-a-file,
  calibrate-bands-margin-a-word (``Band.__init__()`` text), calibrate-corpus-name-a-number
  (another engine error first; ``--segments 5`` could never select it),
  calibrate-write-into-proc (the bands path not checked before the work), env-gpu-count-negative
  (blames ``--devices``);
- a traceback: calibrate-corpus-file-binary (``UnicodeDecodeError``);
- accepted (exit 0) although wrong: run-concurrency-without-a-server,
  run-no-evidence-with-evidence-dir, report-same-folder-twice, report-folder-named-like-a-record,
  report-record-broken-link, report-runs-a-file, report-record-steps-judged-past-tokens,
  report-manifest-complete-a-string, explain-plot-jpeg (an SVG written as ``.jpg``),
  explain-another-registered-engine (native-host explained "within the floor": a wrong
  conclusion), bench-pipelined-speculative (since valid: speculative mode times greedy
  beside, pipelined), import-package-shared-asset-tampered,
  env-step-memo-no, env-cache-a-broken-link; env-http-timeout-nan (exit 1: every cell an error);
- the user's files lost: convert-output-is-the-checkpoint, convert-output-holds-the-checkpoint,
  convert-gguf-into-its-own-folder (``--force`` replaced the checkpoint by its conversion),
  import-package-output-inside-the-source (a variant of the source removed),
  interrupt-import-package-over-an-earlier-import (the earlier import removed before Ctrl-C);
- the case was wrong, not lockstep: run-packages-the-package-yaml (a package's package.yaml is a
  documented spelling of it), prompts-text-only-spaces (three spaces are text the tokenizer
  encodes), convert-name-too-long-for-the-cache (the name does not name the folder; such a
  package converts and runs), env-checkpoints-missing and env-checkpoints-a-text-file
  (without ``--strict`` an engine that cannot run here is left out with its reason and exit 0,
  as documented; the run had said "tried .../nowhere.gguf (missing)" and how to set
  ``LOCKSTEP_CHECKPOINTS``).

Those five were corrected after that run: the first three removed, the two
``LOCKSTEP_CHECKPOINTS`` cases given ``--strict`` (exit 1, a failing run). Without them:
94 of 128 clear (73.4%). env-step-memo-no found a real fault (``no`` silently meant on), but
native-host never reads the variable, and ``no`` now means off: it became
env-step-memo-misspelt (``of``, on native-cuda, the engine that reads it).

After the fixes (each with its case here as its test): 130 of 130 clear. ``KNOWN`` holds
issue 33's leftovers, known before this battery and outside its count.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.test_bad_input_fresh import (  # noqa: E402,F401  (intact, materials: fixtures)
    BASE, TINY, Case, Materials, _calibrate, _copy, _corpus, _manifest, _mp_json,
    _prompts, _record, _run, _user_file, _write, check_case, intact, materials, new_ids,
    run_case)
from suites.test_bad_input_third import _bands, _hf_config, _package, _segment  # noqa: E402

PLANTED = "suites.planted.engines:PositionOffByOne"
BENCH = ["--engines", "native-host", "--packages", "tiny_llama"]
SPEC = ["--engines", "native-host", "--packages", "lookup_chained", "--max-new-tokens", "2",
        "--max-prompts", "1", "--no-evidence"]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def failing(intact, tmp_path_factory) -> Path:
    """A failing record of the planted position-off-by-one engine on the converted package."""
    from harness.cli import main

    folder = tmp_path_factory.mktemp("failing")
    assert main(["run", "--packages", str(intact[1]), "--engines", PLANTED, "--max-new-tokens",
                 "8", "--max-prompts", "1", "--evidence-dir", str(folder)]) == 1
    return next(folder.glob("*.json"))


@pytest.fixture
def bad(materials, failing):
    materials.failing = failing  # this case's materials, and the failing record beside them
    return materials


def _gguf_header(m: Materials, offset: int, value: bytes) -> list[str]:
    """The tiny GGUF with ``value`` written over its header at ``offset`` (4: version,
    8: tensor count, 16: metadata count)."""
    raw = bytearray((m.package.parent / "tiny.gguf").read_bytes())
    raw[offset:offset + len(value)] = value
    path = _write(m.tmp / "model.gguf", bytes(raw))
    return ["convert", str(path), "-o", str(m.tmp / "out")]


def _gguf_in(m: Materials, name: str) -> Path:
    """A folder of the user's holding a copy of the tiny GGUF."""
    folder = m.tmp / name
    folder.mkdir()
    shutil.copy(m.package.parent / "tiny.gguf", folder)
    return folder


def _tensors(m: Materials, change: Callable[[dict], None]) -> list[str]:
    """The HF folder with its safetensors' tensors edited (a dict of numpy arrays)."""
    from safetensors.numpy import load_file, save_file

    folder = _copy(m.hf, m.tmp / "hf")
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _yaml_text(m: Materials, edit: Callable[[str], str]) -> list[str]:
    """The converted package with package.yaml's text edited (not re-dumped)."""
    folder = _copy(m.package, m.tmp / "pkg")
    path = folder / "package.yaml"
    path.write_text(edit(path.read_text()))
    return ["run", "--packages", str(folder), *BASE]


def _with_template(m: Materials, *options: str) -> list[str]:
    from engines.tokenizer import CHAT_TEMPLATE_FILE

    folder = _copy(m.package, m.tmp / "pkg")
    _write(folder / CHAT_TEMPLATE_FILE, TEMPLATE)
    return ["run", "--packages", str(folder), *BASE, *options]


def _chat_file(m: Materials, line: str) -> list[str]:
    return _with_template(m, "--prompts", str(_write(m.tmp / "chat.jsonl", line + "\n")))


def _evidence_dir(m: Materials, damage: Callable[[Path], None]) -> list[str]:
    folder = _copy(m.evidence, m.tmp / "ev")
    damage(folder)
    return ["report", str(folder), "-o", str(m.tmp / "r.html")]


def _failing_record(m, change: Callable[[dict], None]) -> Path:
    doc = json.loads(m.failing.read_text())
    change(doc)
    return _write(m.tmp / m.failing.name, json.dumps(doc))


def _explain(m, *options: str) -> list[str]:
    return ["explain", str(m.failing), "--engine", PLANTED, *options]


def _previous_conversion(m: Materials) -> list[str]:
    out = _copy(m.package, m.tmp / "out")
    return ["convert", str(m.hf), "-o", str(out), "--force"]


def _previous_import(m: Materials) -> list[str]:
    _write(m.tmp / "out" / "cpu-rope" / "package.yaml", "an earlier import\n")
    return ["import-package", str(m.model_package), "-o", str(m.tmp / "out"), "--force"]


def _previous_report(m: Materials) -> list[str]:
    from reports.render import MARKER

    _write(m.tmp / "r.html", f"<html><head>{MARKER}</head>yesterday's report</html>")
    return ["report", str(m.evidence), "-o", str(m.tmp / "r.html")]


def _llama_cpp(m: Materials) -> list[str]:
    return ["run", "--packages", str(m.package), "--engines", "llama-cpp", "--max-new-tokens",
            "2", "--max-prompts", "1", "--no-evidence"]


def _llama_server(m: Materials) -> list[str]:
    return ["run", "--packages", str(m.package), "--engines", "http:llama-server",
            "--max-new-tokens", "2", "--max-prompts", "1", "--no-evidence"]


def _gguf_env(m: Materials) -> str:
    return str(m.package.parent / "tiny.gguf")




LEFT: set[str] = set()  # unclear today, left for a later fix (the report says why): strict xfail


CASES = [
    # run: option values and combinations not tried before
    Case("run-shard-zero-index", lambda m: [*TINY, "--shard", "0/2"], ("--shard", "0/2")),
    Case("run-shard-three-parts", lambda m: [*TINY, "--shard", "1/2/3"], ("--shard", "1/2/3")),
    Case("run-devices-repeated", lambda m: [*TINY, "--devices", "0,0"], ("--devices", "0,0")),
    Case("run-devices-negative", lambda m: [*TINY, "--devices", "-1"], ("--devices", "-1")),
    Case("run-width-without-speculative-mode", lambda m: [*TINY, "--width", "2"],
         ("--width", "--mode")),
    Case("run-concurrency-without-a-server", lambda m: [*TINY, "--concurrency", "4"],
         ("--concurrency", "4")),
    Case("run-no-evidence-with-evidence-dir", lambda m: [
        *TINY, "--evidence-dir", str(m.tmp / "ev")], ("--evidence-dir", "--no-evidence")),
    Case("run-engine-upper-case", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "NATIVE-HOST", "--no-evidence"],
         ("--engines", "NATIVE-HOST")),
    Case("run-engine-module-without-class", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "suites.planted.engines:",
        "--no-evidence"], ("--engines", "suites.planted.engines:")),
    Case("run-package-as-positional", lambda m: ["run", "tiny_llama", "--engines",
                                                 "native-host", "--no-evidence"],
         ("tiny_llama",)),
    Case("run-speculative-on-a-package-without-drafter", lambda m: [
        *TINY, "--mode", "speculative"], ("tiny_llama", "speculative")),
    Case("run-prompt-negative-id", lambda m: _run(m, "--prompt", "5 -1"), ("--prompt", "-1")),
    Case("run-evidence-dir-under-proc", lambda m: [
        "run", "--packages", str(m.package), *BASE[:-1], "--evidence-dir", "/proc/lockstep-ev"],
         ("--evidence-dir", "/proc/lockstep-ev")),
    Case("run-max-new-tokens-past-context", lambda m: _run(m, "--max-new-tokens", "20"),
         ("--max-new-tokens", "20")),  # 17 prompt ids + 20 > the package's 32 positions

    # run: prompt files, new damage
    Case("prompts-utf16", lambda m: _prompts(
        m, '{"text": "hello"}\n'.encode("utf-16")), ("prompts.jsonl",)),
    Case("prompts-comment-line", lambda m: _prompts(m, '# my prompts\n{"text": "x"}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-text-null", lambda m: _prompts(m, '{"text": null}\n'), ("prompts.jsonl:1",)),
    Case("prompts-text-and-chat", lambda m: _prompts(
        m, '{"text": "x", "chat": [{"role": "user", "content": "y"}]}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-chat-message-unknown-key", lambda m: _chat_file(
        m, '{"chat": [{"role": "user", "content": "hi", "name": "bob"}]}'),
         ("chat.jsonl:1", "name")),
    Case("prompts-chat-a-mapping", lambda m: _chat_file(
        m, '{"chat": {"role": "user", "content": "hi"}}'), ("chat.jsonl:1", "chat")),
    Case("prompts-name-very-long", lambda m: [
        "run", "--packages", str(m.package), *BASE[:-1], "--evidence-dir", str(m.tmp / "ev"),
        "--prompts", str(_write(m.tmp / "p.jsonl", json.dumps(
            {"ids": [1, 2], "name": "n" * 400}) + "\n"))], ("p.jsonl:1", "name")),
    Case("prompts-name-nul", lambda m: [
        "run", "--packages", str(m.package), *BASE[:-1], "--evidence-dir", str(m.tmp / "ev"),
        "--prompts", str(_write(m.tmp / "p.jsonl", '{"ids": [1, 2], "name": "a\\u0000b"}\n'))],
         ("p.jsonl:1", "name")),
    Case("prompts-a-package-yaml", lambda m: _run(m, "--prompts", str(m.package /
                                                                      "package.yaml")),
         ("package.yaml:1",)),

    # run: package.yaml and package files, new damage
    Case("package-target-path-absolute", lambda m: _package(
        m, lambda d: d["components"]["target"].update(path="/etc/hostname")),
         ("path", "/etc/hostname")),
    Case("package-target-path-a-folder", lambda m: _package(
        m, lambda d: d["components"]["target"].update(path=".")), ("path",)),
    Case("package-tokenizer-path-a-folder", lambda m: _package(
        m, lambda d: d["tokenizer"].update(path=".")) + ["--text", "hello"], ("tokenizer",)),
    Case("package-yaml-duplicate-key", lambda m: _yaml_text(
        m, lambda t: t + "max_context: 16\n"), ("max_context",)),
    Case("package-key-misspelt", lambda m: _package(m, lambda d: d.update(max_contxt=16)),
         ("max_contxt",)),
    Case("package-name-missing", lambda m: _package(m, lambda d: d.pop("name") and None),
         ("name",)),
    Case("package-format-missing", lambda m: _package(m, lambda d: d.pop("format") and None),
         ("format",)),
    Case("package-state-a-list", lambda m: _package(
        m, lambda d: d.update(state=list(d["state"].values()))), ("state",)),
    Case("package-state-shape-a-string", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(shape="1,1,0,32")), ("shape",)),
    Case("package-dtype-disagrees-with-graph", lambda m: _package(
        m, lambda d: d.update(dtype="float16")), ("dtype", "float16")),
    Case("package-vocab-size-above-logits", lambda m: _package(
        m, lambda d: d.update(vocab_size=1000)), ("vocab_size", "1000")),
    Case("package-prompts-a-mapping", lambda m: _package(
        m, lambda d: d.update(prompts={"p0": [1, 2]})), ("prompts",)),
    Case("package-speculative-a-string", lambda m: _package(
        m, lambda d: d["decoding"].update(speculative="yes")), ("speculative",)),
    Case("package-yaml-a-folder", lambda m: (
        (_copy(m.package, m.tmp / "pkg") / "package.yaml").unlink(),
        (m.tmp / "pkg" / "package.yaml").mkdir(),
        ["run", "--packages", str(m.tmp / "pkg"), *BASE])[-1], ("package.yaml",)),
    Case("package-max-context-fraction", lambda m: _package(
        m, lambda d: d.update(max_context=16.5)), ("max_context", "16.5")),
    Case("package-eos-id-a-list", lambda m: _package(m, lambda d: d.update(eos_id=[2, 3])),
         ("eos_id",)),
    Case("package-tokens-input-missing", lambda m: _package(
        m, lambda d: d["components"]["target"]["inputs"].pop("tokens") and None),
         ("tokens",)),
    Case("package-external-data-a-folder", lambda m: (
        (_copy(m.package, m.tmp / "pkg") / "target.onnx.data").unlink(),
        (m.tmp / "pkg" / "target.onnx.data").mkdir(),
        ["run", "--packages", str(m.tmp / "pkg"), *BASE])[-1], ("target.onnx.data",)),

    # convert: a checkpoint given the wrong way, outputs over the source, damaged tensors
    Case("convert-the-safetensors-file", lambda m: [
        "convert", str(m.hf / "model.safetensors"), "-o", str(m.tmp / "out")],
         ("model.safetensors",)),
    Case("convert-the-config-json", lambda m: [
        "convert", str(m.hf / "config.json"), "-o", str(m.tmp / "out")], ("config.json",)),
    Case("convert-a-folder-holding-a-gguf", lambda m: [
        "convert", str(_gguf_in(m, "models")), "-o", str(m.tmp / "out")], ("tiny.gguf",)),
    Case("convert-output-is-the-checkpoint", lambda m: [
        "convert", str(_copy(m.hf, m.tmp / "hf")), "-o", str(m.tmp / "hf"), "--force"],
         ("-o",), kept=lambda m: m.tmp / "hf" / "config.json"),
    Case("convert-output-holds-the-checkpoint", lambda m: [
        "convert", str(_copy(m.hf, m.tmp / "mine" / "hf")), "-o", str(m.tmp / "mine"),
        "--force"], ("-o",), kept=lambda m: m.tmp / "mine" / "hf" / "model.safetensors"),
    Case("convert-gguf-into-its-own-folder", lambda m: [
        "convert", str(_gguf_in(m, "g") / "tiny.gguf"), "-o", str(m.tmp / "g"), "--force"],
         ("-o",), kept=lambda m: m.tmp / "g" / "tiny.gguf"),
    Case("convert-rope-scaling-llama3-without-factor", lambda m: _hf_config(
        m, rope_scaling={"rope_type": "llama3", "original_max_position_embeddings": 64}),
         ("rope_scaling", "factor")),
    Case("convert-mistral-sliding-window-negative", lambda m: _hf_config(
        m, architectures=["MistralForCausalLM"], sliding_window=-1), ("sliding_window", "-1")),
    Case("convert-eos-token-id-empty-list", lambda m: _hf_config(m, eos_token_id=[]),
         ("eos_token_id",)),
    Case("convert-tensor-missing", lambda m: _tensors(
        m, lambda t: t.pop("model.norm.weight")), ("model.norm.weight",)),
    Case("convert-tensor-extra-layer", lambda m: _tensors(
        m, lambda t: t.update({"model.layers.5.mlp.up_proj.weight":
                               t["model.layers.0.mlp.up_proj.weight"]})), ("model.layers.5",)),
    Case("convert-tensor-integer", lambda m: _tensors(
        m, lambda t: t.update({"model.embed_tokens.weight":
                               t["model.embed_tokens.weight"].astype("int32")})),
         ("model.embed_tokens.weight",)),
    Case("convert-tensor-wrong-shape", lambda m: _tensors(
        m, lambda t: t.update({"model.embed_tokens.weight":
                               t["model.embed_tokens.weight"][:, :63].copy()})),
         ("model.embed_tokens.weight",)),
    Case("convert-gguf-version-99", lambda m: _gguf_header(m, 4, (99).to_bytes(4, "little")),
         ("model.gguf", "99")),
    Case("convert-gguf-tensor-count-huge", lambda m: _gguf_header(
        m, 8, (1 << 60).to_bytes(8, "little")), ("model.gguf",)),
    Case("convert-gguf-metadata-count-huge", lambda m: _gguf_header(
        m, 16, (1 << 60).to_bytes(8, "little")), ("model.gguf",)),
    Case("convert-genai-builder-with-draft-layers", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--builder", "onnxruntime-genai",
        "--draft-layers", "1"], ("--draft-layers", "--builder")),

    # report: evidence folders and records damaged in new ways
    Case("report-same-folder-twice", lambda m: [
        "report", str(m.evidence), str(m.evidence), "-o", str(m.tmp / "r.html")],
         ("EVIDENCE_DIR", "evidence")),
    Case("report-folder-named-like-a-record", lambda m: _evidence_dir(
        m, lambda f: (f / "old.json").mkdir()), ("old.json",)),
    Case("report-record-broken-link", lambda m: _evidence_dir(
        m, lambda f: (f / "gone.json").symlink_to(m.tmp / "nowhere.json")), ("gone.json",)),
    Case("report-record-empty-file", lambda m: _evidence_dir(
        m, lambda f: _write(f / "zero.json", "")), ("zero.json",)),
    Case("report-runs-a-file", lambda m: _evidence_dir(
        m, lambda f: (shutil.rmtree(f / "runs"), _write(f / "runs", "notes"))), ("runs",)),
    Case("report-record-schema-version-a-string", lambda m: _record(
        m, lambda d: d.update(schema_version="2")), ("schema_version",)),
    Case("report-record-created-not-a-date", lambda m: _record(
        m, lambda d: d.update(created="yesterday")), ("created", "yesterday")),
    Case("report-record-ledger-null", lambda m: _record(m, lambda d: d.update(ledger=None)),
         ("ledger",)),
    Case("report-record-digest-disagrees", lambda m: _record(
        m, lambda d: d.update(token_digest="0" * 64)), ("token_digest",)),
    Case("report-record-ok-disagrees", lambda m: _record(m, lambda d: d.update(ok=False)),
         ("ok",)),
    Case("report-record-steps-judged-past-tokens", lambda m: _record(
        m, lambda d: d["judgement"].update(steps_judged=99)), ("steps_judged", "99")),
    Case("report-manifest-complete-a-string", lambda m: _manifest(
        m, lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "complete": "yes"}))),
         ("complete", "yes")),
    Case("report-manifest-planned-cell-without-engine", lambda m: _manifest(
        m, lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "planned": [
            {"package": "tiny-dynamic-float32", "mode": "greedy", "prompt": "p0"}]}))),
         ("planned",)),
    Case("report-bench-a-folder", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--bench", str(m.tmp)],
         ("--bench",)),
    Case("report-catch-matrix-a-folder", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--catch-matrix", str(m.tmp)],
         ("--catch-matrix",)),
    Case("report-catch-matrix-empty-object", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--catch-matrix",
        str(_write(m.tmp / "c.json", "{}"))], ("--catch-matrix",)),
    Case("report-output-under-proc", lambda m: [
        "report", str(m.evidence), "-o", "/proc/lockstep-report.html"], ("-o",)),
    Case("report-baseline-empty-folder", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--baseline",
        str((m.tmp / "b").mkdir() or m.tmp / "b")], ("--baseline",)),

    # explain and repro on a failing record
    Case("explain-plot-jpeg", lambda m: _explain(m, "--plot", str(m.tmp / "curve.jpg")),
         ("--plot", "curve.jpg")),
    Case("explain-another-registered-engine", lambda m: [
        "explain", str(m.failing), "--engine", "native-host"], ("--engine", "native-host")),
    Case("explain-another-package", lambda m: _explain(m, "--package", "tied_llama"),
         ("--package", "tied_llama")),
    Case("explain-package-moved", lambda m: [
        "explain", str(_failing_record(m, lambda d: d["package"].update(
            path=str(m.tmp / "moved")))), "--engine", PLANTED], ("--package",)),
    Case("explain-json-a-folder", lambda m: _explain(m, "--json", str(m.tmp)), ("--json",)),
    Case("explain-plot-under-proc", lambda m: _explain(m, "--plot", "/proc/curve.svg"),
         ("--plot",)),
    Case("repro-output-under-proc", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "-o", "/proc/lockstep-pack"], ("-o",)),
    Case("repro-output-empty", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "-o", ""], ("-o",)),
    Case("repro-package-a-file", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "--package",
        str(_user_file(m, "p.txt")), "-o", str(m.tmp / "pack")], ("--package", "p.txt")),

    # calibrate: engines, corpus and bands
    Case("calibrate-a-float-engine", lambda m: [
        "calibrate", "--engine", "native-host", "--package", str(m.package), "--corpus",
        _corpus(m, _segment(), ("a.txt", "hello world"))[-1]], ("--engine", "native-host")),
    Case("calibrate-bands-schemes-a-list", lambda m: _bands(m, '{"schemes": []}'),
         ("--bands", "schemes")),
    Case("calibrate-bands-margin-a-word", lambda m: _bands(m, json.dumps(
        {"schemes": {"ggml-cpu:q4_0": {"near_tie_margin": "wide"}}})), ("near_tie_margin",)),
    Case("calibrate-corpus-segments-empty", lambda m: _corpus(m, "segments: []\n"),
         ("segments",)),
    Case("calibrate-corpus-name-a-number", lambda m: _corpus(
        m, _segment(name=5), ("a.txt", "hello")), ("segments[0]", "name")),
    Case("calibrate-corpus-file-binary", lambda m: (
        _write(m.tmp / "corpus" / "a.txt", b"\xff\xfe\x00\x01"),
        _corpus(m, _segment()))[1], ("segments[0].file",)),
    Case("calibrate-corpus-file-a-folder", lambda m: (
        (m.tmp / "corpus" / "sub").mkdir(parents=True),
        _corpus(m, _segment(file="sub")))[1], ("segments[0].file", "sub")),
    Case("calibrate-segments-repeated", lambda m: _calibrate(m, "--segments", "a,a"),
         ("--segments", "a,a")),
    Case("calibrate-write-into-proc", lambda m: _calibrate(
        m, "--write", "--bands", "/proc/bands.json"), ("--bands",)),

    # the benches
    Case("bench-width-without-speculative-mode", lambda m: ["bench", *BENCH, "--width", "2"],
         ("--width", "--mode")),
    Case("bench-warmup-steps-negative", lambda m: ["bench", *BENCH, "--warmup-steps", "-1"],
         ("--warmup-steps", "-1")),
    Case("bench-json-under-proc", lambda m: ["bench", *BENCH, "--json", "/proc/b.json"],
         ("--json",)),
    Case("bench-forward-rows-zero", lambda m: ["bench-forward", *BENCH, "--rows", "0"],
         ("--rows", "0")),
    Case("bench-forward-prefix-past-context", lambda m: [
        "bench-forward", *BENCH, "--prefix", "100000"], ("--prefix", "100000")),
    Case("bench-forward-rows-past-context", lambda m: [
        "bench-forward", *BENCH, "--prefix", "60", "--rows", "8"], ("--rows", "8")),
    Case("bench-judge-lengths-zero", lambda m: [
        "bench-judge", *BENCH, "--max-new-tokens", "4", "--lengths", "0,4"],
         ("--lengths", "0")),
    Case("bench-judge-lengths-repeated", lambda m: [
        "bench-judge", *BENCH, "--max-new-tokens", "4", "--lengths", "4,4"],
         ("--lengths", "4,4")),
    Case("bench-judge-engines-empty", lambda m: [
        "bench-judge", "--engines", "", "--packages", "tiny_llama"], ("--engines",)),
    Case("bench-judge-package-missing-folder", lambda m: [
        "bench-judge", "--engines", "native-host", "--packages", str(m.tmp / "gone")],
         ("--packages", "gone")),

    # the importers
    Case("import-package-output-inside-the-source", lambda m: [
        "import-package", str(_copy(m.model_package, m.tmp / "mp")), "-o",
        str(m.tmp / "mp" / "cpu"), "--force"], ("-o",),
         kept=lambda m: m.tmp / "mp" / "cpu" / "tokenizer.json"),
    Case("import-package-a-variant-folder", lambda m: [
        "import-package", str(m.model_package / "cpu-rope"), "-o", str(m.tmp / "out")],
         ("cpu-rope", "manifest.json")),
    Case("import-package-variant-directory-escapes", lambda m: _mp_json(
        m, lambda d: d["components"]["model"]["variants"]["cpu-rope"].update(
            variant_directory="../../etc")), ("variant_directory", "../../etc")),
    Case("import-package-model-file-missing", lambda m: _mp_json(
        m, lambda d: d["components"]["model"]["variants"]["cpu-rope"]["executor_info"][
            "nxrt"].update(model_file="model2.onnx")), ("model2.onnx",)),
    Case("import-package-tokenizer-hash-unknown", lambda m: _mp_json(
        m, lambda d: d["components"]["model"]["variants"]["cpu-rope"]["executor_info"][
            "nxrt"].update(tokenizer="sha256:" + "0" * 64)), ("tokenizer",)),
    Case("import-package-shared-asset-tampered", lambda m: (
        _mp_json(m, lambda d: None),
        _write(next((m.tmp / "mp" / "shared_assets").glob("sha256-*")) / "tokenizer.json",
               '{"tampered": true}'))[0], ("sha256",)),
    Case("import-genai-prompts-from-a-text-file", lambda m: [
        "import-genai", str(m.tmp), "--prompts-from", str(_user_file(m, "notes.txt")), "-o",
        str(m.tmp / "o")], ("--prompts-from", "notes.txt")),
    Case("import-genai-config-a-list", lambda m: [
        "import-genai", str(_write(m.tmp / "g" / "genai_config.json", "[]").parent), "-o",
        str(m.tmp / "o")], ("genai_config.json",)),
    Case("import-genai-name-empty", lambda m: [
        "import-genai", str(m.tmp), "--name", "", "-o", str(m.tmp / "o")], ("--name",)),

    # cache, fixtures, claims and the command line itself
    Case("cache-without-action", lambda m: ["cache"], ("ACTION",)),
    Case("cache-list-extra-argument", lambda m: ["cache", "list", "old"], ("old",)),
    Case("fixtures-list-extra-argument", lambda m: ["fixtures", "list", "tiny_llama"],
         ("tiny_llama",)),
    Case("claims-unknown-option", lambda m: ["claims", "--markdown"], ("--markdown",)),

    # environment variables
    Case("env-http-timeout-nan", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "http:openai=http://127.0.0.1:9",
        "--no-evidence"], ("LOCKSTEP_HTTP_TIMEOUT", "nan"), env={"LOCKSTEP_HTTP_TIMEOUT": "nan"}),
    Case("env-http-slots-word", _llama_server, ("LOCKSTEP_HTTP_SLOTS", "two"),
         env={"LOCKSTEP_HTTP_SLOTS": "two"}),
    Case("env-llama-threads-zero", _llama_cpp, ("LOCKSTEP_LLAMA_THREADS", "0"),
         env={"LOCKSTEP_LLAMA_THREADS": "0", "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    # an engine that cannot run here fails only under --strict, and then as a failing run
    # (docs/ENGINES.md): exit 1
    Case("env-checkpoints-missing", lambda m: [*_llama_cpp(m), "--strict"],
         ("LOCKSTEP_CHECKPOINTS", "nowhere.gguf"), status=1,
         env={"LOCKSTEP_CHECKPOINTS": lambda m: str(m.tmp / "nowhere.gguf")}),
    Case("env-checkpoints-a-text-file", lambda m: [*_llama_cpp(m), "--strict"],
         ("LOCKSTEP_CHECKPOINTS", "notes.gguf"), status=1,
         env={"LOCKSTEP_CHECKPOINTS": lambda m: str(_write(m.tmp / "notes.gguf", "notes"))}),
    # corrected after the first run (see above): the engine that reads it, a misspelt value
    Case("env-step-memo-misspelt", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native-cuda", "--no-evidence"],
         ("LOCKSTEP_STEP_MEMO", "of"), env={"LOCKSTEP_STEP_MEMO": "of"}),
    Case("env-gpu-count-negative", lambda m: [*TINY, "--devices", "all"],
         ("LOCKSTEP_GPU_COUNT", "-1"), env={"LOCKSTEP_GPU_COUNT": "-1"}),
    Case("env-llama-server-a-folder", _llama_server, ("LOCKSTEP_LLAMA_SERVER",),
         env={"LOCKSTEP_LLAMA_SERVER": lambda m: str(m.tmp), "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    Case("env-cache-a-broken-link", lambda m: ["cache", "list"], ("LOCKSTEP_CACHE",),
         env={"LOCKSTEP_CACHE": lambda m: (os.symlink(m.tmp / "gone", m.tmp / "cache"),
                                           str(m.tmp / "cache"))[1]}),

    # Ctrl-C in the middle of work that replaces what the user had
    Case("interrupt-convert-over-an-earlier-conversion", _previous_conversion, ("interrupted",),
         kept=lambda m: m.tmp / "out" / "package.yaml", status=130,
         interrupt="harness.convert.conversion:write_converted"),
    Case("interrupt-import-package-over-an-earlier-import", _previous_import, ("interrupted",),
         kept=lambda m: m.tmp / "out" / "cpu-rope" / "package.yaml", status=130,
         interrupt="engines.model_package:import_model_package"),
    Case("interrupt-report-over-an-earlier-report", _previous_report, ("interrupted",),
         kept=lambda m: m.tmp / "r.html", status=130, interrupt="reports:render_report"),
]

# issue 33's leftovers, known before this battery was written (so not in its count); the
# fourth, ``lockstep engines`` on a bad LOCKSTEP_LLAMA_SERVER, is in test_engines_cli.py
KNOWN = [
    Case("explain-empty-object", lambda m: ["explain", str(_write(m.tmp / "e.json", "{}"))],
         ("e.json", "the required fields", "are missing"), shuns=("schema version",)),
    Case("bench-speculative-without-a-speculative-section", lambda m: [
        "bench", *BENCH, "--mode", "speculative"],
         ("--packages", "'tiny_llama' has no speculative section", "--mode greedy"),
         shuns=("lockstep run",)),
    Case("calibrate-bands-a-folder-in-words", lambda m: _calibrate(m, "--bands", str(m.tmp)),
         ("--bands", "is a folder"), shuns=("IsADirectoryError", "Errno")),
]


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason="left unclear")]
                 if c.id in LEFT else []) for c in CASES])
def test_fourth_bad_input_ends_in_one_clear_line(case, bad, capsys, monkeypatch):
    run_case(case, bad, capsys, monkeypatch)


@pytest.mark.parametrize("case", KNOWN, ids=[c.id for c in KNOWN])
def test_issue_33_leftovers_end_in_one_clear_line(case, materials, capsys):
    check_case(case, materials, capsys)


def test_the_cases_are_new():
    """No case repeats an id of the earlier batteries."""
    from suites import test_bad_input_battery, test_bad_input_fresh, test_bad_input_third

    assert new_ids(CASES, test_bad_input_battery, test_bad_input_fresh, test_bad_input_third)
