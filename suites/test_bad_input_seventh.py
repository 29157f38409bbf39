"""A seventh battery of bad inputs (issue 33's acceptance, measured on inputs no fix was driven
by): new options, values, damage and files beside those of the earlier batteries
(``test_bad_input_battery.py``, ``_fresh``, ``_third``, ``_fourth``, ``_fifth``, ``_sixth``),
written blind to the fixes being made while it was written, across every command a user
types, the files they read (prompt files, package.yaml and its files, Hugging Face folders and
GGUFs, evidence records and run manifests, onnxruntime-genai builds and onnx-genai packages,
the calibration corpus and bands table), the environment variables lockstep reads, outputs
that would land on the user's files, and Ctrl-C.

The same notion of clear as the earlier batteries: the documented exit status (2 for bad
input, 130 for an interrupt), no traceback, one ``lockstep: error:`` line naming the field and
the value (the ``needles``) with a remedy (an interrupt: one ``lockstep: interrupted`` line),
the user's files untouched, within ``SECONDS``.

First run (wip-battery7 at b172897: main 40a5bc6 merged on the go signal into this file's
first commit 1a461c0; all 87 cases written before any was run; 13.6 s): 83 of 87 clear
(95.4%), 4 not:

- accepted (exit 0) although wrong, or refused for another fault:
  calibrate-bands-flip-rate-above-one (a band row's ``flip_rate: 1.5`` passed the bands
  table's check, which runs before the work; the line named the default corpus: ``the prompt
  is 3479 tokens, longer than the context of 'tiny-dynamic-float32' [field segments[0].file =
  '3479 tokens']``);
- the case was wrong, not lockstep: run-shard-with-spaces (``--shard "1 / 2"`` is read as
  ``1/2``, the same plan: ``0 cells planned`` for both, the one cell in shard 2 of 2),
  import-genai-model-type-unknown (genai_config.json's ``model.type`` only words the package's
  description; the graph is what is wrapped and judged, so ``bert`` there changes nothing),
  calibrate-bands-missing-file (a bands path where no table exists yet is documented as
  accepted: ``--write`` creates it; it was refused for the default corpus, its second fault);
- no traceback, no user file overwritten, no case too slow.

The three wrong cases were removed, calibrate-bands-flip-rate-above-one given a small corpus:
it then names ``--engine 'native-host'`` (no numeric scheme), never ``flip_rate``, the bands
table read first having accepted the rate: a lockstep fault. 83 of 84 clear (98.8%).

Fixed since (``engines.tolerances``: a band's flip rate is a share of steps, at most 1), with
its case here as its test: 84 of 84 clear.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.test_bad_input_fifth import (  # noqa: E402
    GPUS, _band_row, _edit_manifest, _genai_build, _import_genai)
from suites.test_bad_input_fourth import (  # noqa: E402,F401  (bad, failing: fixtures)
    PLANTED, _chat_file, _explain, _gguf_env, _llama_server, _with_template, _yaml_text, bad,
    failing)
from suites.test_bad_input_fresh import (  # noqa: E402,F401  (intact, materials: fixtures)
    BASE, TINY, Case, Materials, _calibrate, _copy, _corpus, _manifest, _mp_file, _mp_json,
    _mp_metadata, _prompts, _record, _run, _user_file, _write, intact, materials, new_ids,
    run_case)
from suites.test_bad_input_sixth import CUDA, HTTP, _marked  # noqa: E402
from suites.test_bad_input_third import (  # noqa: E402
    BENCH, _bands, _hf, _hf_config, _package, _segment)

CACHE = {"LOCKSTEP_CACHE": lambda m: str(m.tmp / "cache")}  # never the shared cache
NINE_LISTS = "['x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'], " * 9  # a value printed whole


def _folder_with_notes(m: Materials, name: str) -> Path:
    """A folder of the user's holding their notes (an output folder lockstep must not fill)."""
    return _user_file(m, f"{name}/notes.txt").parent


def _link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def _text_prompts(m: Materials) -> str:
    return str(_write(m.tmp / "prompts.jsonl", '{"text": "hello world"}\n'))


def _escaping_tokenizer(doc: dict, m: Materials) -> None:
    """package.yaml's tokenizer path pointing out of its folder, at a real tokenizer there."""
    shutil.copyfile(m.package / "tokenizer.json", m.tmp / "tokenizer.json")
    doc["tokenizer"].update(path="../tokenizer.json")


def _unclosed_template(m: Materials) -> list[str]:
    from engines.tokenizer import CHAT_TEMPLATE_FILE

    argv = _with_template(m, "--chat", "hi")
    _write(m.tmp / "pkg" / CHAT_TEMPLATE_FILE, "{% for m in messages %}{{ m['content'] }}")
    return argv


def _utf16_yaml(m: Materials) -> list[str]:
    """package.yaml saved as UTF-16 (as some Windows editors save it)."""
    folder = _copy(m.package, m.tmp / "pkg")
    path = folder / "package.yaml"
    path.write_bytes(path.read_text().encode("utf-16"))
    return ["run", "--packages", str(folder), *BASE]


def _anchored_name(text: str) -> str:
    """package.yaml whose name is a value built of YAML anchors: 9**6 strings once expanded."""
    value = "&a0 [" + ", ".join(["x"] * 9) + "]"
    for depth in range(1, 6):
        value = f"&a{depth} [{value}, " + ", ".join([f"*a{depth - 1}"] * 8) + "]"
    return re.sub(r"^name: .*$", lambda _: f"name: {value}", text, count=1, flags=re.M)


def _small_corpus(m: Materials) -> str:
    """A one-segment corpus that fits the converted package (the default one does not)."""
    return _corpus(m, _segment(), ("a.txt", "hello world"))[-1]


def _gguf_as_safetensors(m: Materials) -> list[str]:
    return _hf(m, "model.safetensors", (m.package.parent / "tiny.gguf").read_bytes())


def _earlier_judge_bench(m: Materials) -> list[str]:
    from harness.judge_bench import MARKER

    return ["bench-judge", *BENCH, "--lengths", "4,8", "--max-new-tokens", "2", "--json",
            str(_marked(m, "judge.json", MARKER))]


def _earlier_plot(m: Materials) -> list[str]:
    from harness.forensics.plot import PLOT_MARKER

    _write(m.tmp / "curve.svg", '<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg">'
                                f"<metadata>{PLOT_MARKER}</metadata></svg>\n")
    return _explain(m, "--plot", str(m.tmp / "curve.svg"))


def _repro_beside_notes(m: Materials) -> list[str]:
    return ["repro", str(m.failing), "--engine", PLANTED, "-o",
            str(_folder_with_notes(m, "pack")), "--force"]


def _judge_bench_json(m: Materials) -> Path:
    from harness.judge_bench import MARKER

    return _marked(m, "judge.json", MARKER)


# lockstep's faults found by the first run, left for a later fix: strict xfail, with why
LEFT: dict[str, str] = {}

CASES = [
    # run: option values a new user types
    Case("run-max-prompts-zero", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native-host", "--no-evidence",
        "--max-new-tokens", "2", "--max-prompts", "0"], ("--max-prompts", "0")),
    Case("run-engines-underscore", lambda m: [
        "run", "--packages", "tiny_llama", "--engines", "native_host", "--no-evidence"],
         ("--engines", "native_host")),
    Case("run-packages-fixture-misspelt", lambda m: [
        "run", "--packages", "tiny_lama", "--engines", "native-host", "--no-evidence"],
         ("--packages", "tiny_lama")),
    Case("run-packages-repeated", lambda m: [
        "run", "--packages", "tiny_llama,tiny_llama", *BASE], ("--packages", "tiny_llama")),
    Case("run-devices-empty", lambda m: [*TINY, "--devices", ""], ("--devices",), env=GPUS),
    Case("run-devices-all-without-a-gpu", lambda m: [*TINY, "--devices", "all"],
         ("--devices", "all"), env={"LOCKSTEP_GPU_COUNT": "0"}),
    Case("run-prompts-file-with-devices", lambda m: _run(
        m, "--devices", "0", "--prompts", _text_prompts(m)), ("--devices", "--prompts"),
         env=GPUS),
    Case("run-evidence-dir-under-a-users-file", lambda m: [
        "run", "--packages", "tiny_llama", *BASE[:-1], "--evidence-dir",
        str(_user_file(m, "notes.txt") / "ev")], ("--evidence-dir",),
         kept=lambda m: m.tmp / "notes.txt"),

    # run: prompt files
    Case("prompts-text-key-misspelt", lambda m: _prompts(m, '{"txt": "hello"}\n'),
         ("prompts.jsonl:1", "txt")),
    Case("prompts-python-dict", lambda m: _prompts(m, "{'text': 'hello'}\n"),
         ("prompts.jsonl:1",)),
    Case("prompts-name-with-a-newline", lambda m: _prompts(
        m, '{"text": "x", "name": "a\\nb"}\n'), ("prompts.jsonl:1", "name")),
    Case("prompts-chat-content-parts", lambda m: _chat_file(
        m, '{"chat": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}'),
         ("chat.jsonl:1", "content")),
    Case("prompts-second-line-role-empty", lambda m: _chat_file(
        m, '{"text": "a"}\n{"chat": [{"role": "", "content": "x"}]}'),
         ("chat.jsonl:2", "role")),
    Case("prompts-a-broken-link", lambda m: _run(
        m, "--prompts", str(_link(m.tmp / "prompts.jsonl", m.tmp / "gone.jsonl"))),
         ("--prompts", "prompts.jsonl")),

    # run: package.yaml and the package's files
    Case("package-vocab-size-zero", lambda m: _package(m, lambda d: d.update(vocab_size=0)),
         ("vocab_size", "0")),
    Case("package-max-context-zero", lambda m: _package(m, lambda d: d.update(max_context=0)),
         ("max_context", "0")),
    Case("package-bos-id-negative", lambda m: _package(m, lambda d: d.update(bos_id=-1)),
         ("bos_id", "-1")),
    Case("package-dtype-int4", lambda m: _package(m, lambda d: d.update(dtype="int4")),
         ("dtype", "int4")),
    Case("package-name-with-a-slash", lambda m: _package(
        m, lambda d: d.update(name="team/model")), ("name", "team/model")),
    Case("package-format-2", lambda m: _package(m, lambda d: d.update(format=2)),
         ("format", "2")),
    Case("package-tokenizer-kind-unknown", lambda m: _package(
        m, lambda d: d["tokenizer"].update(kind="sentencepiece")),
         ("tokenizer", "sentencepiece")),
    Case("package-tokenizer-path-escapes", lambda m: _package(
        m, lambda d: _escaping_tokenizer(d, m)), ("tokenizer", "../tokenizer.json")),
    Case("package-target-path-misspelt", lambda m: _package(
        m, lambda d: d["components"]["target"].update(path="targett.onnx")),
         ("targett.onnx",)),
    Case("package-tokens-input-renamed", lambda m: _package(
        m, lambda d: d["components"]["target"]["inputs"].update(tokens="tokens_in")),
         ("tokens_in",)),
    Case("package-seq-axis-past-rank", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(seq_axis=7)), ("seq_axis", "7")),
    Case("package-state-kind-unknown", lambda m: _package(
        m, lambda d: d["state"]["k0"].update(kind="cache")), ("kind", "cache")),
    Case("package-prompts-an-empty-prompt", lambda m: _package(
        m, lambda d: d.update(prompts=[[]])), ("prompts",)),
    Case("package-chat-template-unclosed", _unclosed_template, ("chat_template.jinja",)),
    Case("package-yaml-utf16", _utf16_yaml, ("package.yaml",)),
    Case("package-yaml-anchors-in-name", lambda m: _yaml_text(m, _anchored_name),
         ("package.yaml", "name"), shuns=(NINE_LISTS,)),

    # convert: Hugging Face folders, GGUFs and options
    Case("convert-vocab-size-below-the-embeddings", lambda m: _hf_config(m, vocab_size=3),
         ("vocab_size", "3")),
    Case("convert-hidden-size-a-string", lambda m: _hf_config(m, hidden_size="64"),
         ("hidden_size", "64")),
    Case("convert-attention-heads-zero", lambda m: _hf_config(m, num_attention_heads=0),
         ("num_attention_heads", "0")),
    Case("convert-rope-theta-negative", lambda m: _hf_config(m, rope_theta=-10000.0),
         ("rope_theta", "-10000")),
    Case("convert-a-gguf-named-safetensors", _gguf_as_safetensors, ("model.safetensors",)),
    Case("convert-max-context-negative", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--max-context", "-5"],
         ("--max-context", "-5")),
    Case("convert-draft-layers-negative", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--draft-layers", "-1"],
         ("--draft-layers", "-1")),
    Case("convert-prompt-lookup-zero", lambda m: [
        "convert", str(m.hf), "-o", str(m.tmp / "out"), "--prompt-lookup", "0"],
         ("--prompt-lookup", "0")),
    Case("convert-output-holds-users-notes", lambda m: [
        "convert", str(m.hf), "-o", str(_folder_with_notes(m, "out"))], ("-o", "--force"),
         kept=lambda m: m.tmp / "out" / "notes.txt"),

    # report: records and manifests edited by hand, odd folders and outputs
    Case("report-record-ok-a-string", lambda m: _record(m, lambda d: d.update(ok="yes")),
         ("ok", "yes")),
    Case("report-record-wall-seconds-negative", lambda m: _record(
        m, lambda d: d["timings"].update(wall_s=-1.0)), ("wall_s", "-1")),
    Case("report-record-judgement-a-list", lambda m: _record(
        m, lambda d: d.update(judgement=[])), ("judgement",)),
    Case("report-record-budget-without-claim", lambda m: _record(
        m, lambda d: d.update(budgets=[{"budget": 0.0, "measured": 0.0}])), ("budgets",)),
    Case("report-manifest-command-a-string", lambda m: _manifest(
        m, _edit_manifest(lambda d: d.update(command="lockstep run"))),
         ("command", "lockstep run")),
    Case("report-output-is-the-evidence-folder", lambda m: [
        "report", str(_copy(m.evidence, m.tmp / "ev")), "-o", str(m.tmp / "ev")], ("-o",),
         kept=lambda m: next((m.tmp / "ev").glob("*.json"))),
    Case("report-evidence-a-broken-link", lambda m: [
        "report", str(_link(m.tmp / "yesterday", m.tmp / "gone")), "-o",
        str(m.tmp / "r.html")], ("yesterday",)),
    Case("report-bench-a-judge-bench-json", lambda m: [
        "report", str(m.evidence), "-o", str(m.tmp / "r.html"), "--bench",
        str(_judge_bench_json(m))], ("--bench", "judge.json")),

    # explain and repro on a failing record
    Case("explain-step-past-the-end", lambda m: _explain(m, "--step", "999"),
         ("--step", "999")),
    Case("explain-factor-zero", lambda m: _explain(m, "--factor", "0"), ("--factor", "0")),
    Case("explain-top-negative", lambda m: _explain(m, "--top", "-3"), ("--top", "-3")),
    Case("explain-package-fixture-misspelt", lambda m: _explain(m, "--package", "tiny_lama"),
         ("--package", "tiny_lama")),
    Case("explain-plot-over-a-users-svg", lambda m: _explain(
        m, "--plot", str(_user_file(m, "curve.svg"))), ("--plot", "--force"),
         kept=lambda m: m.tmp / "curve.svg"),
    Case("explain-json-over-a-users-notes", lambda m: _explain(
        m, "--json", str(_user_file(m, "why.json"))), ("--json",),
         kept=lambda m: m.tmp / "why.json"),
    Case("repro-max-runs-zero", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "-o", str(m.tmp / "pack"), "--max-runs",
        "0"], ("--max-runs", "0")),
    Case("repro-factor-negative", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "-o", str(m.tmp / "pack"), "--factor",
        "-2"], ("--factor", "-2")),
    Case("repro-output-holds-users-notes", lambda m: [
        "repro", str(m.failing), "--engine", PLANTED, "-o", str(_folder_with_notes(m, "pack"))],
         ("-o", "--force"), kept=lambda m: m.tmp / "pack" / "notes.txt"),

    # calibrate: the corpus and the bands table
    Case("calibrate-corpus-file-a-broken-link", lambda m: (
        _link(m.tmp / "corpus" / "a.txt", m.tmp / "gone.txt"), _corpus(m, _segment()))[1],
         ("segments[0].file",)),
    Case("calibrate-corpus-segment-name-empty", lambda m: _corpus(
        m, _segment(name=""), ("a.txt", "hello world")), ("segments[0].name",)),
    Case("calibrate-corpus-empty-file", lambda m: _corpus(m, ""), ("corpus.yaml",)),
    Case("calibrate-bands-flip-rate-above-one", lambda m: [
        *_bands(m, _band_row(flip_rate=1.5)), "--corpus", _small_corpus(m)],
         ("flip_rate", "1.5")),

    # the benches
    Case("bench-repeats-zero", lambda m: ["bench", *BENCH, "--repeats", "0"],
         ("--repeats", "0")),
    Case("bench-max-new-tokens-zero", lambda m: ["bench", *BENCH, "--max-new-tokens", "0"],
         ("--max-new-tokens", "0")),
    Case("bench-baseline-misspelt", lambda m: ["bench", *BENCH, "--baseline", "ort-cpuu"],
         ("--baseline", "ort-cpuu")),
    Case("bench-prompts-an-empty-file", lambda m: [
        "bench", *BENCH, "--prompts", str(_write(m.tmp / "empty.jsonl", ""))],
         ("empty.jsonl",)),
    Case("bench-forward-warmup-negative", lambda m: [
        "bench-forward", *BENCH, "--warmup", "-1"], ("--warmup", "-1")),
    Case("bench-forward-json-over-users-notes", lambda m: [
        "bench-forward", *BENCH, "--json", str(_user_file(m, "fw.json"))], ("--json",),
         kept=lambda m: m.tmp / "fw.json"),
    Case("bench-judge-lengths-negative", lambda m: [
        "bench-judge", *BENCH, "--lengths", "-4,8"], ("--lengths", "-4")),

    # the importers
    Case("import-genai-bos-a-string", lambda m: _import_genai(
        m, lambda c: c["model"].update(bos_token_id="1")), ("bos_token_id", "1")),
    Case("import-genai-layers-zero", lambda m: _import_genai(
        m, lambda c: c["model"]["decoder"].update(num_hidden_layers=0)),
         ("num_hidden_layers", "0")),
    Case("import-genai-logits-output-renamed", lambda m: _import_genai(
        m, lambda c: c["model"]["decoder"]["outputs"].update(logits="scores")), ("scores",)),
    Case("import-genai-name-a-path", lambda m: [
        "import-genai", str(_genai_build(m)), "--name", "../x", "-o", str(m.tmp / "o")],
         ("--name", "../x")),
    Case("import-genai-output-holds-users-notes", lambda m: [
        "import-genai", str(_genai_build(m)), "-o", str(_folder_with_notes(m, "o"))],
         ("-o", "--force"), kept=lambda m: m.tmp / "o" / "notes.txt"),
    Case("import-package-manifest-empty-object", lambda m: _mp_json(m, lambda d: {}),
         ("manifest.json",)),
    Case("import-package-tokenizer-corrupt", lambda m: _mp_file(
        m, "cpu/tokenizer.json", "{nope"), ("tokenizer.json",)),
    Case("import-package-position-ids-input-renamed", lambda m: _mp_metadata(
        m, lambda d: d["model"]["io"].update(position_ids_input="pos")),
         ("position_ids_input", "'pos'")),

    # cache and the command line itself
    Case("cache-prune-max-size-word", lambda m: [
        "cache", "prune", "--max-size", "big", "--dry-run"], ("--max-size", "big"), env=CACHE),

    # environment variables
    Case("env-cache-a-file", lambda m: ["cache", "list"], ("LOCKSTEP_CACHE",),
         kept=lambda m: m.tmp / "cache.txt",
         env={"LOCKSTEP_CACHE": lambda m: str(_user_file(m, "cache.txt"))}),
    Case("env-http-timeout-negative", lambda m: HTTP, ("LOCKSTEP_HTTP_TIMEOUT", "-5"),
         env={"LOCKSTEP_HTTP_TIMEOUT": "-5"}),
    Case("env-http-startup-timeout-word", _llama_server,
         ("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "soon"),
         env={"LOCKSTEP_HTTP_STARTUP_TIMEOUT": "soon", "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    Case("env-http-slots-negative", _llama_server, ("LOCKSTEP_HTTP_SLOTS", "-2"),
         env={"LOCKSTEP_HTTP_SLOTS": "-2", "LOCKSTEP_CHECKPOINTS": _gguf_env}),
    Case("env-step-memo-a-number", lambda m: CUDA, ("LOCKSTEP_STEP_MEMO", "2"),
         env={"LOCKSTEP_STEP_MEMO": "2"}),

    # Ctrl-C in the middle of work beside what the user had
    Case("interrupt-bench-judge-over-an-earlier-json", _earlier_judge_bench, ("interrupted",),
         kept=lambda m: m.tmp / "judge.json", status=130,
         interrupt="harness.judge_bench:run_matrix"),
    Case("interrupt-explain-over-an-earlier-plot", _earlier_plot, ("interrupted",),
         kept=lambda m: m.tmp / "curve.svg", status=130,
         interrupt="harness.forensics.explain:_explain"),
    Case("interrupt-repro-beside-users-notes", _repro_beside_notes, ("interrupted",),
         kept=lambda m: m.tmp / "pack" / "notes.txt", status=130,
         interrupt="harness.forensics.repro:shrink_prompt"),
]


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=LEFT[c.id])]
                 if c.id in LEFT else []) for c in CASES])
def test_seventh_bad_input_ends_in_one_clear_line(case, bad, capsys, monkeypatch):
    run_case(case, bad, capsys, monkeypatch)


def test_the_cases_are_new():
    """No case repeats an id of the earlier batteries, and every fault left names a case."""
    from suites import (test_bad_input_battery, test_bad_input_fifth, test_bad_input_fourth,
                        test_bad_input_fresh, test_bad_input_sixth, test_bad_input_third)

    assert new_ids(CASES, test_bad_input_battery, test_bad_input_fresh, test_bad_input_third,
                   test_bad_input_fourth, test_bad_input_fifth, test_bad_input_sixth)
    assert set(LEFT) <= {c.id for c in CASES}
