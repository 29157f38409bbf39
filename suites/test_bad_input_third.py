"""A third battery of bad inputs (issue 33's acceptance, measured on inputs no fix was driven
by): new options, new damage and new files beside those of ``test_bad_input_battery.py`` and
``test_bad_input_fresh.py``, across the commands a user types, the files they read
(prompt files, package.yaml and its files, checkpoints, evidence, onnx-genai packages, the
calibration corpus and bands table) and the environment variables lockstep reads.

The same notion of clear as the fresh battery: the documented exit status (2 for bad input),
no traceback, one ``lockstep: error:`` line naming the field and the value (the ``needles``)
with a remedy, the user's files untouched, within ``SECONDS``.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.test_bad_input_fresh import (  # noqa: E402,F401  (intact, materials: fixtures)
    BASE, TINY, Case, Materials, _calibrate, _copy, _copy_with, _corpus, _manifest, _mp_file,
    _mp_json, _prompts, _record, _record_path, _run, _user_file, _write, intact, materials,
    run_case)


def _package(m: Materials, change: Callable[[dict], object]) -> list[str]:
    """The converted package with package.yaml edited (a returned value replaces it)."""
    import yaml

    folder = _copy(m.package, m.tmp / "pkg")
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    replaced = change(doc)
    path.write_text(yaml.safe_dump(doc if replaced is None else replaced, sort_keys=False))
    return ["run", "--packages", str(folder), *BASE]


def _package_file(m: Materials, name: str, content: str | bytes | None) -> list[str]:
    folder = _copy_with(m.package, m.tmp / "pkg", name, content)
    return ["run", "--packages", str(folder), *BASE]


def _hf(m: Materials, name: str, content: str | bytes | None) -> list[str]:
    """The HF folder with one file written (None: removed), converted."""
    folder = _copy_with(m.hf, m.tmp / "hf", name, content)
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _hf_config(m: Materials, **changes) -> list[str]:
    folder = _copy(m.hf, m.tmp / "hf")
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _bands(m: Materials, text: str) -> list[str]:
    return _calibrate(m, "--bands", str(_write(m.tmp / "bands.json", text)))


def _segment(**changes) -> str:
    seg = {"name": "a", "kind": "plain", "topic": "prose", "file": "a.txt", **changes}
    return "segments:\n  - " + json.dumps({k: v for k, v in seg.items() if v is not None}) + "\n"


def _genai(m: Materials, config: str | None) -> list[str]:
    folder = m.tmp / "genai"
    folder.mkdir()
    if config is not None:
        _write(folder / "genai_config.json", config)
    return ["import-genai", str(folder), "-o", str(m.tmp / "o")]


def _evidence_with(m: Materials, name: str, text: str) -> list[str]:
    folder = _copy(m.evidence, m.tmp / "ev")
    _write(folder / name, text)
    return ["report", str(folder), "-o", str(m.tmp / "r.html")]


def _mp_without(m: Materials, variant: str) -> list[str]:
    argv = _mp_json(m, lambda d: None)
    shutil.rmtree(m.tmp / "mp" / variant)
    return argv


BENCH = ["--engines", "native-host", "--packages", "tiny_llama"]
SPEC = ["run", "--packages", "lookup_chained", *BASE, "--mode", "speculative"]




LEFT: set[str] = set()  # unclear today, left for a later fix (the report says why): strict xfail


CASES = [
    # run: option values not tried before
    Case("run-shard-n-zero", lambda m: [*TINY, "--shard", "1/0"], ("--shard", "1/0")),
    Case("run-shard-no-slash", lambda m: [*TINY, "--shard", "2"], ("--shard",)),
    Case("run-concurrency-decimal", lambda m: [*TINY, "--concurrency", "1.5"],
         ("--concurrency", "1.5")),
    Case("run-oracle-mode-unknown", lambda m: [*TINY, "--oracle-mode", "exact"],
         ("--oracle-mode", "exact")),
    Case("run-width-past-max", lambda m: [*SPEC, "--width", "99"], ("--width", "99")),
    Case("run-width-all-misspelt", lambda m: [*SPEC, "--width", "al"], ("--width", "al")),
    Case("run-devices-absent-gpu", lambda m: [*TINY, "--devices", "7"], ("--devices", "7")),
    Case("run-engines-http-unknown-protocol", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "http:ollama=http://127.0.0.1:9",
        "--no-evidence"], ("--engines", "ollama")),
    Case("run-packages-missing-folder", lambda m: [
        "run", "--packages", str(m.tmp / "no" / "such"), *BASE], ("--packages", "such")),
    Case("run-oracle-engine-unknown", lambda m: [*TINY, "--oracle-engine", "ort-cdua"],
         ("--oracle-engine", "ort-cdua")),
    Case("run-prompt-hex-ids", lambda m: _run(m, "--prompt", "0x10 0x11"),
         ("--prompt", "0x10")),
    Case("run-prompt-past-context", lambda m: _run(m, "--prompt", " ".join(["5"] * 40)),
         ("prompt", "40", "32")),
    Case("run-chat-on-fixture-without-tokenizer", lambda m: [*TINY, "--chat", "hi"],
         ("--chat",)),

    # run: prompt files, new damage
    Case("prompts-plain-text-lines", lambda m: _prompts(m, "hello\nworld\n", "prompts.txt"),
         ("prompts.txt:1",)),
    Case("prompts-ids-nested", lambda m: _prompts(m, '{"ids": [[1, 2]]}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-ids-past-context", lambda m: _prompts(
        m, json.dumps({"ids": [5] * 40}) + "\n"), ("prompts.jsonl:1", "max_context")),
    Case("prompts-name-empty", lambda m: _prompts(m, '{"text": "x", "name": ""}\n'),
         ("prompts.jsonl:1", "name")),
    Case("prompts-name-duplicate", lambda m: _prompts(
        m, '{"text": "a", "name": "p"}\n{"text": "b", "name": "p"}\n'),
         ("prompts.jsonl:2", "name")),
    Case("prompts-name-a-path", lambda m: _prompts(m, '{"text": "x", "name": "../../up"}\n'),
         ("prompts.jsonl:1", "name")),
    Case("prompts-text-without-tokenizer", lambda m: [
        *TINY, "--prompts", str(_write(m.tmp / "p.jsonl", '{"text": "hello"}\n'))],
         ("p.jsonl:1", "tokenizer")),
    Case("prompts-chat-without-template", lambda m: _prompts(
        m, '{"chat": [{"role": "user", "content": "hi"}]}\n'), ("prompts.jsonl:1", "chat")),
    Case("prompts-ids-a-mapping", lambda m: _prompts(m, '{"ids": {"0": 1}}\n'),
         ("prompts.jsonl:1",)),

    # run: package.yaml fields and files not damaged before
    Case("package-yaml-empty", lambda m: _package_file(m, "package.yaml", ""),
         ("package.yaml",)),
    Case("package-yaml-a-list", lambda m: _package(m, lambda d: [d]), ("package.yaml",)),
    Case("package-max-context-word", lambda m: _package(
        m, lambda d: d.update(max_context="big")), ("max_context", "big")),
    Case("package-bos-id-a-string", lambda m: _package(m, lambda d: d.update(bos_id="one")),
         ("bos_id", "one")),
    Case("package-eos-id-past-vocab", lambda m: _package(m, lambda d: d.update(eos_id=99999)),
         ("eos_id", "99999")),
    Case("package-tokenizer-a-string", lambda m: _package(
        m, lambda d: d.update(tokenizer="tokenizer.json")), ("tokenizer",)),
    Case("package-state-update-unknown", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(update="prepend")), ("update", "prepend")),
    Case("package-state-component-missing", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(component="drafter")), ("component", "drafter")),
    Case("package-no-components", lambda m: _package(m, lambda d: d.pop("components") and None),
         ("components",)),
    Case("package-onnx-deleted", lambda m: _package_file(m, "target.onnx", None),
         ("target.onnx",)),
    Case("package-tokenizer-deleted", lambda m: _package_file(
        m, "tokenizer.json", None) + ["--text", "hello"], ("tokenizer.json",)),

    # report: evidence damaged in new ways
    Case("report-evidence-missing", lambda m: [
        "report", str(m.tmp / "nowhere"), "-o", str(m.tmp / "r.html")], ("nowhere",)),
    Case("report-record-tokens-negative", lambda m: _record(
        m, lambda d: d.update(tokens=[-1, 2])), ("tokens",)),
    Case("report-record-prompt-a-string", lambda m: _record(
        m, lambda d: d.update(prompt="p0")), ("prompt",)),
    Case("report-record-mode-kind-unknown", lambda m: _record(
        m, lambda d: d["mode"].update(kind="beam")), ("mode",)),
    Case("report-record-budgets-a-mapping", lambda m: _record(
        m, lambda d: d.update(budgets={"zero_staging": 0})), ("budgets",)),
    Case("report-record-package-name-missing", lambda m: _record(
        m, lambda d: d["package"].pop("name")), ("package",)),
    Case("report-record-empty-object", lambda m: _evidence_with(m, "zz-empty.json", "{}"),
         ("zz-empty.json",)),
    Case("report-manifest-planned-a-string", lambda m: _manifest(
        m, lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "planned": "all"}))),
         ("planned", "all"), shuns=("interrupted",)),
    Case("report-manifest-run-id-missing", lambda m: _manifest(
        m, lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items()
                                              if k != "run_id"}))), ("run_id",),
         shuns=("interrupted",)),  # JSON that is not a manifest was edited, not cut short
    Case("report-bench-not-json", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--bench",
        str(_write(m.tmp / "b.json", "{nope"))], ("--bench", "b.json")),
    Case("report-catch-matrix-missing", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--catch-matrix",
        str(m.tmp / "none.json")], ("--catch-matrix",)),
    Case("report-output-in-missing-folder-under-record", lambda m: [
        "report", str(m.evidence), "-o", str(_record_path(m) / "r.html")], ("-o",)),

    # convert: new files of a Hugging Face folder, new options
    Case("convert-hf-tokenizer-not-a-tokenizer", lambda m: _hf(
        m, "tokenizer.json", '{"version": "1.0"}'), ("tokenizer.json",)),
    Case("convert-hf-no-safetensors", lambda m: _hf(m, "model.safetensors", None),
         ("safetensors",)),
    Case("convert-hf-config-deleted", lambda m: _hf(m, "config.json", None), ("config.json",)),
    # head_dim is given (32), so 7 heads need a (64, 224) query weight the file lacks
    Case("convert-heads-disagree-with-weights", lambda m: _hf_config(m, num_attention_heads=7),
         ("l0.wq", "heads")),
    Case("convert-max-context-word", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--max-context", "lots"],
         ("--max-context", "lots")),
    Case("convert-draft-layers-word", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--draft-layers", "two"],
         ("--draft-layers", "two")),
    Case("convert-dtype-unknown", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--dtype", "int8"], ("--dtype", "int8")),

    # calibrate: corpus and bands table
    Case("calibrate-corpus-missing", lambda m: _calibrate(m, "--corpus", str(m.tmp / "c.yaml")),
         ("--corpus", "c.yaml")),
    Case("calibrate-corpus-kind-unknown", lambda m: _corpus(
        m, _segment(kind="poem"), ("a.txt", "hello")), ("segments[0]", "poem")),
    Case("calibrate-corpus-no-file-key", lambda m: _corpus(
        m, _segment(file=None), ("a.txt", "hello")), ("segments[0]", "file")),
    Case("calibrate-corpus-file-missing", lambda m: _corpus(m, _segment(file="gone.txt")),
         ("segments[0].file", "gone.txt")),
    Case("calibrate-corpus-chat-role-unknown", lambda m: _corpus(
        m, _segment(kind="chat", file="c.yaml"),
        ("c.yaml", "- {role: wizard, content: hi}\n")), ("segments[0]", "wizard")),
    Case("calibrate-segments-unknown", lambda m: _calibrate(m, "--segments", "no_such_seg"),
         ("--segments", "no_such_seg")),
    Case("calibrate-bands-a-list", lambda m: _bands(m, "[]"), ("--bands",),
         kept=lambda m: m.tmp / "bands.json"),
    # the tiny GGUF holds float16 tensors: nothing for a quantized engine's band to measure
    Case("calibrate-llama-cpp-on-a-float-gguf", lambda m: [
        "calibrate", "--engine", "llama-cpp", "--package", str(m.package), "--corpus",
        _corpus(m, _segment(), ("a.txt", "hello world"))[-1]], ("F16", "--package"),
         env={"LOCKSTEP_CHECKPOINTS": lambda m: str(m.package.parent / "tiny.gguf")}),
    Case("calibrate-bands-a-folder", lambda m: _calibrate(m, "--bands", str(m.tmp)),
         ("--bands",)),

    # the benches
    Case("bench-repeats-word", lambda m: ["bench", *BENCH, "--repeats", "many"],
         ("--repeats", "many")),
    Case("bench-max-new-tokens-past-context", lambda m: [
        "bench", *BENCH, "--max-new-tokens", "100000"], ("--max-new-tokens", "100000")),
    Case("bench-speculative-without-drafter", lambda m: [
        "bench", *BENCH, "--mode", "speculative"], ("tiny_llama", "speculative")),
    Case("bench-warmup-steps-past-tokens", lambda m: [
        "bench", *BENCH, "--max-new-tokens", "4", "--warmup-steps", "10"],
         ("--warmup-steps", "10", "--max-new-tokens")),
    Case("bench-forward-prefix-word", lambda m: ["bench-forward", *BENCH, "--prefix", "x"],
         ("--prefix", "x")),
    Case("bench-forward-repeats-zero", lambda m: ["bench-forward", *BENCH, "--repeats", "0"],
         ("--repeats", "0")),
    Case("bench-forward-json-under-a-file", lambda m: [
        "bench-forward", *BENCH, "--json", str(_user_file(m, "notes.txt") / "b.json")],
         ("--json",), kept=lambda m: m.tmp / "notes.txt"),
    Case("bench-judge-lengths-empty", lambda m: ["bench-judge", *BENCH, "--lengths", ""],
         ("--lengths",)),
    Case("bench-judge-lengths-past-context", lambda m: [
        "bench-judge", *BENCH, "--max-new-tokens", "4", "--lengths", "4,100000"],
         ("--lengths", "100000")),
    Case("bench-judge-new-tokens-fill-context", lambda m: [
        "bench-judge", *BENCH, "--lengths", "4"], ("--max-new-tokens",),
         shuns=("within 0",)),  # the default 64 new tokens fill tiny_llama's 64 positions
    Case("bench-judge-json-a-folder", lambda m: ["bench-judge", *BENCH, "--json", str(m.tmp)],
         ("--json",)),

    # explain and repro
    Case("explain-missing-file", lambda m: ["explain", str(m.tmp / "gone.json")],
         ("gone.json",)),
    Case("explain-not-json", lambda m: ["explain", str(_write(m.tmp / "e.json", "{nope"))],
         ("e.json",)),
    Case("explain-an-html-report", lambda m: ["explain", str(_write(
        m.tmp / "report.html", "<html></html>"))], ("report.html", "EVIDENCE_FILE"),
         shuns=("delete it",), kept=lambda m: m.tmp / "report.html"),
    Case("repro-missing-file", lambda m: ["repro", str(m.tmp / "gone.json"), "-o",
                                          str(m.tmp / "pack")], ("gone.json",)),
    Case("repro-a-folder", lambda m: ["repro", str(m.evidence), "-o", str(m.tmp / "pack")],
         ("evidence",)),
    Case("repro-a-passing-record", lambda m: ["repro", str(_record_path(m)), "-o",
                                              str(m.tmp / "pack")], ("status",),
         shuns=("--step",)),  # repro has no --step
    Case("repro-max-runs-word", lambda m: ["repro", str(_record_path(m)), "-o",
                                           str(m.tmp / "pack"), "--max-runs", "lots"],
         ("--max-runs", "lots")),

    # the importers
    Case("import-genai-missing-folder", lambda m: [
        "import-genai", str(m.tmp / "nowhere"), "-o", str(m.tmp / "o")], ("nowhere",)),
    Case("import-genai-no-config", lambda m: _genai(m, None), ("genai_config.json",)),
    Case("import-genai-config-not-json", lambda m: _genai(m, "{nope"), ("genai_config.json",)),
    Case("import-genai-config-without-decoder", lambda m: _genai(m, '{"model": {}}'),
         ("genai_config.json", "model.decoder")),
    Case("import-package-missing-folder", lambda m: [
        "import-package", str(m.tmp / "nowhere"), "-o", str(m.tmp / "o")], ("nowhere",)),
    Case("import-package-variant-folder-gone", lambda m: _mp_without(m, "cpu-rope"),
         ("cpu-rope",)),
    Case("import-package-model-onnx-random", lambda m: _mp_file(
        m, "cpu-rope/model.onnx", b"\x08\x07garbage" * 50), ("model.onnx",)),
    Case("import-package-output-a-file", lambda m: [
        "import-package", str(m.model_package), "-o", str(_user_file(m, "o.txt"))], ("-o",),
         kept=lambda m: m.tmp / "o.txt"),
    Case("import-package-components-model-a-string", lambda m: _mp_json(
        m, lambda d: d["components"].update(model="cpu")), ("components",)),

    # cache, fixtures, engines, claims
    Case("cache-prune-max-size-negative", lambda m: [
        "cache", "prune", "--max-size", "-5", "--dry-run"], ("--max-size", "-5")),
    Case("cache-prune-older-than-empty", lambda m: [
        "cache", "prune", "--older-than", "", "--dry-run"], ("--older-than",)),
    Case("cache-unknown-subcommand", lambda m: ["cache", "clean"], ("clean",)),
    Case("fixtures-build-second-name-misspelt", lambda m: [
        "fixtures", "build", "tiny_llama", "tiny_lama"], ("tiny_lama",)),
    Case("fixtures-unknown-subcommand", lambda m: ["fixtures", "remove"], ("remove",)),
    Case("claims-extra-argument", lambda m: ["claims", "all"], ("all",)),
    Case("engines-extra-argument", lambda m: ["engines", "native-host"], ("native-host",)),

    # environment variables
    Case("env-llama-threads-word", lambda m: [
        "run", "--packages", str(m.package), "--engines", "llama-cpp", "--max-new-tokens", "2",
        "--max-prompts", "1", "--no-evidence"], ("LOCKSTEP_LLAMA_THREADS", "many"),
         env={"LOCKSTEP_LLAMA_THREADS": "many"}),
    Case("env-http-slots-zero", lambda m: [
        "run", "--packages", str(m.package), "--engines", "http:llama-server", "--no-evidence"],
         ("LOCKSTEP_HTTP_SLOTS", "0"), env={"LOCKSTEP_HTTP_SLOTS": "0"}),
    Case("env-http-startup-timeout-negative", lambda m: [
        "run", "--packages", str(m.package), "--engines", "http:llama-server", "--no-evidence"],
         ("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "-5"), env={"LOCKSTEP_HTTP_STARTUP_TIMEOUT": "-5"}),
    Case("env-llama-server-not-a-binary", lambda m: [
        "run", "--packages", str(m.package), "--engines", "http:llama-server", "--no-evidence",
        "--max-new-tokens", "2", "--max-prompts", "1"], ("LOCKSTEP_LLAMA_SERVER",),
         env={"LOCKSTEP_LLAMA_SERVER": "/etc/hostname",
              "LOCKSTEP_CHECKPOINTS": lambda m: str(m.package.parent / "tiny.gguf")}),
    Case("env-gpu-count-word", lambda m: [*TINY, "--devices", "all"],
         ("LOCKSTEP_GPU_COUNT", "two"), env={"LOCKSTEP_GPU_COUNT": "two"}),
    Case("env-http-timeout-zero", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "http:openai=http://127.0.0.1:9",
        "--no-evidence"], ("LOCKSTEP_HTTP_TIMEOUT", "0"), env={"LOCKSTEP_HTTP_TIMEOUT": "0"}),
]


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason="left unclear")]
                 if c.id in LEFT else []) for c in CASES])
def test_third_bad_input_ends_in_one_clear_line(case, materials, capsys, monkeypatch):
    run_case(case, materials, capsys, monkeypatch)
