"""A battery of bad inputs tried as a new user would: corrupt checkpoint files, bad config
values, bad package.yaml fields and package files, bad prompts, bad evidence folders.

Each case runs the command a user would type (``lockstep convert``, ``run``, ``report``) on
one damaged input and must end in one clear line: exit 2, no traceback, one
``lockstep: error:`` line that names the field or the file (the ``needles``), within a
bounded time (nothing hangs or allocates for minutes on a corrupt file).
"""
from __future__ import annotations

import json
import shutil
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.convert_support import write_tiny_gguf, write_tiny_hf  # noqa: E402
from suites.support import one_line_error  # noqa: E402

SECONDS = 30  # a case that takes longer has hung, or is allocating for a corrupt value
RUN = ["--engines", "native-host", "--max-new-tokens", "2", "--max-prompts", "1",
       "--no-evidence"]
DEEP = "[" * 100_000 + "]" * 100_000  # nested past Python's recursion limit


@dataclass
class Materials:
    """The intact inputs every case damages a copy of."""
    hf: Path  # a tiny Hugging Face folder (config.json + model.safetensors)
    gguf: Path  # a tiny GGUF with a tokenizer
    package: Path  # that GGUF converted (dynamic cache, max_context 32, tokenizer)
    evidence: Path  # one run's evidence folder
    tmp: Path  # this case's own folder


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    from harness.cli import main
    from harness.convert.conversion import convert

    root = tmp_path_factory.mktemp("intact")
    hf = write_tiny_hf(root / "hf")
    gguf_path = write_tiny_gguf(root / "tiny.gguf")
    package = convert(gguf_path, root / "pkg", max_context=32).folder
    evidence = root / "evidence"
    assert main(["run", "--packages", str(package), *RUN[:-1], "--evidence-dir",
                 str(evidence)]) == 0
    return hf, gguf_path, package, evidence


@pytest.fixture
def materials(intact, tmp_path):
    hf, gguf_path, package, evidence = intact
    return Materials(hf, gguf_path, package, evidence, tmp_path)


# -- damage helpers -----------------------------------------------------------------------------

def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def _config(m: Materials, **changes) -> list[str]:
    """The HF folder with config.json fields changed (None: removed), converted."""
    folder = _copy(m.hf, m.tmp / "hf")
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _config_text(m: Materials, text: str | bytes) -> list[str]:
    folder = _copy(m.hf, m.tmp / "hf")
    data = text.encode() if isinstance(text, str) else text
    (folder / "config.json").write_bytes(data)
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _hf_file(m: Materials, name: str, content: str | bytes) -> list[str]:
    folder = _copy(m.hf, m.tmp / "hf")
    _write(folder / name, content)
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _safetensors(m: Materials, damage: Callable[[bytes], bytes]) -> list[str]:
    folder = _copy(m.hf, m.tmp / "hf")
    path = folder / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    return ["convert", str(folder), "-o", str(m.tmp / "out")]


def _header(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _with_header(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _edit_tensor(raw: bytes, **fields) -> bytes:
    """One tensor's header entry changed (the first one, by name)."""
    header, data = _header(raw)
    name = sorted(k for k in header if k != "__metadata__")[0]
    header[name].update(fields)
    return _with_header(header, data)


def _gguf(m: Materials, damage: Callable[[bytes], bytes]) -> list[str]:
    path = m.tmp / "model.gguf"
    path.write_bytes(damage(m.gguf.read_bytes()))
    return ["convert", str(path), "-o", str(m.tmp / "out")]


def _gguf_arch(m: Materials, arch: str) -> list[str]:
    import gguf

    path = m.tmp / f"{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((16, 8), "float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ["convert", str(path), "-o", str(m.tmp / "out")]


def _gguf_meta(m: Materials, key: str, value) -> list[str]:
    """The tiny GGUF written again with one metadata value replaced (its type follows the
    Python value's: a string, a float, a signed or unsigned integer)."""
    import gguf

    kind = (gguf.GGUFValueType.STRING if isinstance(value, str)
            else gguf.GGUFValueType.FLOAT32 if isinstance(value, float)
            else gguf.GGUFValueType.INT32 if value < 0 else gguf.GGUFValueType.UINT32)
    original = gguf.GGUFWriter.write_header_to_file

    def with_value(self, *args, **kwargs):
        self.add_key_value(key, value, kind)
        return original(self, *args, **kwargs)

    gguf.GGUFWriter.write_header_to_file = with_value
    try:
        path = write_tiny_gguf(m.tmp / "meta.gguf")
    finally:
        gguf.GGUFWriter.write_header_to_file = original
    return ["convert", str(path), "-o", str(m.tmp / "out")]


def _convert_option(m: Materials, *options: str) -> list[str]:
    return ["convert", str(m.hf), "-o", str(m.tmp / "out"), *options]


def _package(m: Materials, **changes) -> list[str]:
    """The package with package.yaml fields changed (dotted paths into the mapping)."""
    folder = _copy(m.package, m.tmp / "pkg")
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for part in parents:
            node = node[part]
        node[leaf] = value
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return ["run", "--packages", str(folder), *RUN]


def _package_file(m: Materials, name: str, damage: Callable[[bytes], bytes]) -> list[str]:
    folder = _copy(m.package, m.tmp / "pkg")
    path = folder / name
    path.write_bytes(damage(path.read_bytes()))
    return ["run", "--packages", str(folder), *RUN]


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _prompts(m: Materials, text: str | bytes) -> list[str]:
    path = _write(m.tmp / "prompts.jsonl", text)
    return ["run", "--packages", str(m.package), *RUN, "--prompts", str(path)]


def _run_with(m: Materials, *options: str) -> list[str]:
    return ["run", "--packages", str(m.package), *RUN, *options]


def _chat(m: Materials, *options: str,
          template: str | bytes = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
          ) -> list[str]:
    """The package with a chat template beside its tokenizer, run with ``options``."""
    from engines.tokenizer import CHAT_TEMPLATE_FILE

    folder = _copy(m.package, m.tmp / "pkg")
    _write(folder / CHAT_TEMPLATE_FILE, template)
    return ["run", "--packages", str(folder), *RUN, *options]


def _evidence(m: Materials, name: str, content: str | bytes) -> list[str]:
    folder = _copy(m.evidence, m.tmp / "evidence")
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return ["report", str(folder), "-o", str(m.tmp / "report.html")]


def _report_with(m: Materials, option: str, content: str) -> list[str]:
    path = m.tmp / "side.json"
    path.write_text(content)
    return ["report", str(m.evidence), "-o", str(m.tmp / "report.html"), option, str(path)]


def _cut(n: int) -> Callable[[bytes], bytes]:
    return lambda raw: raw[:n]


def _cut_fraction(share: float) -> Callable[[bytes], bytes]:
    return lambda raw: raw[:int(len(raw) * share)]


def _random(n: int, prefix: bytes = b"") -> Callable[[bytes], bytes]:
    import random

    rng = random.Random(n)
    return lambda raw: prefix + bytes(rng.randrange(256) for _ in range(n))


GEMMA_BASE = {"hidden_act": None, "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4}
ARCH_BASE = {"Gemma2ForCausalLM": GEMMA_BASE, "Gemma3ForCausalLM": GEMMA_BASE,
             "GraniteForCausalLM": {"embedding_multiplier": 2.0, "attention_multiplier": 0.2,
                                    "residual_multiplier": 0.5, "logits_scaling": 4.0}}


# -- the battery --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Materials], list[str]]
    needles: tuple[str, ...]  # each must be in the error line: the field or the file
    ok: bool = False  # a damage the command tolerates: exit 0, still no traceback


CASES = [
    # a Hugging Face config.json with a field missing, mistyped or out of range
    *(Case(f"config-missing-{f}", lambda m, f=f: _config(m, **{f: None}), (f, "config.json"))
      for f in ("hidden_size", "num_attention_heads", "num_hidden_layers",
                "intermediate_size", "vocab_size")),
    *(Case(f"config-{f}={v!r}", lambda m, f=f, v=v: _config(m, **{f: v}), (f,))
      for f, v in (("num_hidden_layers", -2), ("num_hidden_layers", 0),
                   ("num_hidden_layers", "four"), ("num_hidden_layers", 2.5),
                   ("num_hidden_layers", True), ("num_hidden_layers", 1_000_000_000),
                   ("num_hidden_layers", 3), ("hidden_size", -64), ("hidden_size", "64"),
                   ("num_attention_heads", 0), ("num_key_value_heads", 3),
                   ("num_key_value_heads", -1), ("head_dim", 0), ("head_dim", 31),
                   ("vocab_size", 0), ("vocab_size", 10 ** 12), ("intermediate_size", 1.5),
                   ("rms_norm_eps", "1e-6"), ("rms_norm_eps", -1.0),
                   ("rope_theta", 0), ("rope_theta", "big"), ("rope_scaling", "linear"),
                   ("rope_scaling", {"type": "linear", "factor": "two"}),
                   ("rope_scaling", {"type": "linear", "factor": -2.0}),
                   ("max_position_embeddings", -1), ("max_position_embeddings", "4k"),
                   ("tie_word_embeddings", "yes"), ("bos_token_id", 5000),
                   ("eos_token_id", "2"), ("eos_token_id", -1), ("eos_token_id", [2, "x"]),
                   ("architectures", "LlamaForCausalLM"), ("architectures", []),
                   ("hidden_act", 7), ("partial_rotary_factor", "half"))),
    Case("config-rms_norm_eps=NaN", lambda m: _config_text(
        m, json.dumps({**json.loads((m.hf / "config.json").read_text()),
                       "rms_norm_eps": float("nan")})), ("rms_norm_eps",)),
    Case("config-attention_bias=string", lambda m: _config(m, attention_bias="false"),
         ("attention_bias",)),
    Case("config-is-a-list", lambda m: _config_text(m, "[1, 2]"), ("config.json",)),
    Case("config-deeply-nested", lambda m: _config_text(m, DEEP), ("config.json",)),
    Case("config-empty", lambda m: _config_text(m, ""), ("config.json",)),
    Case("config-binary", lambda m: _config_text(m, b"\xff\xfe\x00garbage"), ("config.json",)),
    Case("config-index-missing-shard", lambda m: (
        (_copy(m.hf, m.tmp / "hf") / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})),
        ["convert", str(m.tmp / "hf"), "-o", str(m.tmp / "out")])[1],
        ("model-00002-of-00002.safetensors",)),
    Case("config-index-not-json", lambda m: (
        (_copy(m.hf, m.tmp / "hf") / "model.safetensors.index.json").write_text("{"),
        ["convert", str(m.tmp / "hf"), "-o", str(m.tmp / "out")])[1],
        ("model.safetensors.index.json",)),
    Case("config-index-without-weight-map", lambda m: (
        (_copy(m.hf, m.tmp / "hf") / "model.safetensors.index.json").write_text("{}"),
        ["convert", str(m.tmp / "hf"), "-o", str(m.tmp / "out")])[1],
        ("model.safetensors.index.json", "weight_map")),
    # the tokenizer's files beside a Hugging Face config
    *(Case(f"hf-{name}-{what}", lambda m, name=name, content=content: _hf_file(m, name, content),
           (name,))
      for name, what, content in (("tokenizer_config.json", "a-list", "[1, 2]"),
                                  ("tokenizer_config.json", "deeply-nested", DEEP),
                                  ("tokenizer_config.json", "binary", b"\xff\xfe\x00"),
                                  ("chat_template.jinja", "binary", b"\xff\xfe\x00"),
                                  ("tokenizer.json", "truncated", '{"version": "1.0", "mod'))),
    # Gemma / Granite / Mistral fields of the wrong type or range (the rest of each config
    # as that architecture's would be)
    *(Case(f"config-{arch}-{f}={v!r}", lambda m, arch=arch, f=f, v=v: _config(
        m, architectures=[arch], **{**ARCH_BASE.get(arch, {}), f: v}), (f,))
      for arch, f, v in (("Gemma2ForCausalLM", "attn_logit_softcapping", "x"),
                         ("Gemma2ForCausalLM", "final_logit_softcapping", 0),
                         ("Gemma2ForCausalLM", "query_pre_attn_scalar", -1),
                         ("Gemma3ForCausalLM", "sliding_window_pattern", "x"),
                         ("Gemma3ForCausalLM", "rope_local_base_freq", "x"),
                         ("GraniteForCausalLM", "embedding_multiplier", "2"),
                         ("MistralForCausalLM", "sliding_window", True))),

    # model.safetensors damaged
    Case("safetensors-truncated-data", lambda m: _safetensors(m, _cut_fraction(0.5)),
         ("model.safetensors", "truncated")),
    Case("safetensors-truncated-header", lambda m: _safetensors(m, _cut(300)),
         ("model.safetensors",)),
    Case("safetensors-random-bytes", lambda m: _safetensors(m, _random(50_000)),
         ("model.safetensors",)),
    Case("safetensors-empty", lambda m: _safetensors(m, _cut(0)), ("model.safetensors",)),
    Case("safetensors-huge-header-length", lambda m: _safetensors(
        m, lambda raw: b"\xff" * 8 + raw[8:]), ("model.safetensors",)),
    Case("safetensors-header-a-list", lambda m: _safetensors(
        m, lambda raw: _with_header([1, 2, 3], b"")), ("model.safetensors",)),
    Case("safetensors-negative-shape", lambda m: _safetensors(
        m, lambda raw: _edit_tensor(raw, shape=[-4, 16])), ("model.safetensors",)),
    Case("safetensors-shape-a-string", lambda m: _safetensors(
        m, lambda raw: _edit_tensor(raw, shape="big")), ("model.safetensors",)),
    Case("safetensors-offsets-past-the-end", lambda m: _safetensors(
        m, lambda raw: _edit_tensor(raw, data_offsets=[0, 10 ** 12])), ("model.safetensors",)),
    Case("safetensors-offsets-disagree-with-shape", lambda m: _safetensors(
        m, lambda raw: _edit_tensor(raw, data_offsets=[0, 12])), ("model.safetensors",)),
    Case("safetensors-entry-not-an-object", lambda m: _safetensors(
        m, lambda raw: _with_header({**_header(raw)[0], "x": 5}, _header(raw)[1])),
        ("model.safetensors",)),
    Case("safetensors-dtype-unknown", lambda m: _safetensors(
        m, lambda raw: _edit_tensor(raw, dtype="Q9")), ("model.safetensors",)),
    Case("safetensors-header-not-utf8", lambda m: _safetensors(
        m, lambda raw: struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc"), ("model.safetensors",)),
    Case("safetensors-header-deeply-nested", lambda m: _safetensors(
        m, lambda raw: struct.pack("<Q", len(DEEP)) + DEEP.encode()), ("model.safetensors",)),

    # a GGUF damaged, or of an architecture lockstep does not convert from GGUF
    Case("gguf-truncated-data", lambda m: _gguf(m, _cut_fraction(0.7)),
         ("model.gguf", "truncated")),
    Case("gguf-truncated-header", lambda m: _gguf(m, _cut(2000)), ("model.gguf",)),
    Case("gguf-random-bytes", lambda m: _gguf(m, _random(50_000)), ("model.gguf",)),
    Case("gguf-random-after-magic", lambda m: _gguf(
        m, _random(50_000, b"GGUF\x03\x00\x00\x00")), ("model.gguf",)),
    Case("gguf-empty", lambda m: _gguf(m, _cut(0)), ("model.gguf",)),
    Case("gguf-gemma3", lambda m: _gguf_arch(m, "gemma3"),
         ("general.architecture", "Hugging Face")),
    Case("gguf-gemma2", lambda m: _gguf_arch(m, "gemma2"),
         ("general.architecture", "Hugging Face")),
    Case("gguf-mamba", lambda m: _gguf_arch(m, "mamba"), ("general.architecture",)),

    *(Case(f"gguf-{key}={value!r}", lambda m, key=key, value=value: _gguf_meta(m, key, value),
           (key,))
      for key, value in (("llama.block_count", 7), ("llama.block_count", "two"),
                         ("llama.embedding_length", 0), ("llama.attention.head_count", 0),
                         ("llama.attention.head_count_kv", 3), ("llama.context_length", 0),
                         ("llama.attention.layer_norm_rms_epsilon", -1.0),
                         ("llama.rope.freq_base", "x"), ("tokenizer.ggml.bos_token_id", 99999),
                         ("tokenizer.ggml.eos_token_id", 99999))),

    # convert options
    Case("convert-max-context-1e8", lambda m: _convert_option(m, "--max-context", "100000000"),
         ("--max-context", "16777216")),
    Case("convert-max-context-1", lambda m: _convert_option(m, "--max-context", "1"),
         ("--max-context",)),
    Case("convert-draft-layers-0", lambda m: _convert_option(m, "--draft-layers", "0"),
         ("--draft-layers",)),
    Case("convert-draft-layers-99", lambda m: _convert_option(m, "--draft-layers", "99"),
         ("--draft-layers",)),
    Case("convert-missing-path", lambda m: ["convert", str(m.tmp / "nowhere"), "-o",
                                            str(m.tmp / "out")], ("CHECKPOINT",)),

    # package.yaml fields
    Case("package-max-context-past-rope-table", lambda m: _package(m, max_context=64),
         ("max_context", "target.onnx")),
    *(Case(f"package-{k}={v!r}", lambda m, k=k, v=v: _package(m, **{k: v}),
           (k.split("__")[-1],))
      for k, v in (("vocab_size", "96"), ("vocab_size", 0), ("vocab_size", 7),
                   ("bos_id", 99999), ("eos_id", -1), ("dtype", "float64"),
                   ("max_context", 0), ("max_context", 1 << 40), ("format", 2),
                   ("name", "a b/c"), ("prompts", [[]]), ("prompts", [[1, 99999]]),
                   ("prompts", "1 2 3"), ("components__target__path", "missing.onnx"),
                   ("components__target__path", "../escape.onnx"),
                   ("components__target__inputs__tokens", "no_such_input"),
                   ("components__target__outputs__logits", "no_such_output"),
                   ("state__k0__shape", [1, 2, 0]), ("state__k0__dtype", "int8"),
                   ("state__k0__seq_axis", 7), ("state__k0__kind", "cache"),
                   ("tokenizer__path", "missing.json"), ("tokenizer__kind", "sentencepiece"),
                   ("decoding__greedy", "yes"))),
    Case("package-reference-missing", lambda m: _package(
        m, reference={"folder": "twin", "content_hash": "sha256:" + "0" * 64}),
        ("reference.folder",)),
    Case("package-yaml-invalid", lambda m: _package_file(
        m, "package.yaml", lambda raw: raw + b"\n  : : [\n"), ("package.yaml",)),
    Case("package-yaml-binary", lambda m: _package_file(
        m, "package.yaml", lambda raw: b"\xff\xfe\x00\x01" * 10), ("package.yaml",)),
    Case("package-yaml-deeply-nested", lambda m: _package_file(
        m, "package.yaml", lambda raw: DEEP.encode()), ("package.yaml",)),
    Case("package-onnx-truncated", lambda m: _package_file(m, "target.onnx", _cut(500)),
         ("target.onnx",)),
    Case("package-onnx-random", lambda m: _package_file(m, "target.onnx", _random(4000)),
         ("target.onnx",)),
    Case("package-external-data-truncated", lambda m: _package_file(
        m, "target.onnx.data", _cut_fraction(0.5)), ("target.onnx.data", "truncated")),
    Case("package-external-data-empty", lambda m: _package_file(
        m, "target.onnx.data", _cut(0)), ("target.onnx.data",)),
    Case("package-tokenizer-corrupt", lambda m: _package_file(
        m, "tokenizer.json", _cut(100)) + ["--text", "hello"], ("tokenizer.json",)),

    # prompts: options and files
    Case("text-lone-surrogate", lambda m: _run_with(m, "--text", "hello \udcff"), ("--text",)),
    Case("chat-lone-surrogate", lambda m: _chat(m, "--chat", "hi \udc80"), ("--chat",)),
    *(Case(f"chat-template-{what}", lambda m, template=template: _chat(
        m, "--chat", "hello", template=template), ("chat_template.jinja",))
      for what, template in (("binary", b"\xff\xfe\x00"), ("syntax", "{% for %}"),
                             ("raises", "{{ 1 // 0 }}"), ("undefined", "{{ nothing.here }}"))),
    Case("prompts-text-lone-surrogate", lambda m: _prompts(m, '{"text": "hi \\ud800"}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-chat-lone-surrogate", lambda m: _chat(m, "--prompts", str(
        _write(m.tmp / "chat.jsonl", '{"chat": [{"role": "user", "content": "\\udfff"}]}\n'))),
        ("chat.jsonl:1",)),
    Case("prompts-name-lone-surrogate", lambda m: _prompts(
        m, '{"text": "hi", "name": "a\\ud800"}\n'), ("prompts.jsonl:1",)),
    Case("prompts-deeply-nested", lambda m: _prompts(m, DEEP + "\n"), ("prompts.jsonl:1",)),
    Case("prompts-binary", lambda m: _prompts(m, b"\xff\xfe\x00\x01garbage"), ("--prompts",)),
    Case("prompts-a-folder", lambda m: _run_with(m, "--prompts", str(m.tmp)), ("--prompts",)),
    Case("prompts-missing", lambda m: _run_with(m, "--prompts", str(m.tmp / "none.jsonl")),
         ("--prompts",)),
    Case("prompts-empty", lambda m: _prompts(m, "\n\n"), ("--prompts",)),
    Case("prompts-line-a-list", lambda m: _prompts(m, "[1, 2]\n"), ("prompts.jsonl:1",)),
    Case("prompts-ids-huge", lambda m: _prompts(m, '{"ids": [1, 100000000000000000000000]}\n'),
         ("prompts.jsonl:1",)),
    Case("prompts-ids-float", lambda m: _prompts(m, '{"ids": [1, 2.5]}\n'), ("prompts.jsonl:1",)),
    Case("prompts-ids-negative", lambda m: _prompts(m, '{"ids": [1, -3]}\n'), ("prompt",)),
    Case("prompts-text-empty", lambda m: _prompts(m, '{"text": ""}\n'), ("prompts.jsonl:1",)),
    Case("prompts-text-a-number", lambda m: _prompts(m, '{"text": 5}\n'), ("prompts.jsonl:1",)),
    Case("prompts-chat-role-unknown", lambda m: _prompts(
        m, '{"chat": [{"role": "robot", "content": "x"}]}\n'), ("prompts.jsonl:1",)),
    Case("prompts-unknown-field", lambda m: _prompts(m, '{"txt": "x"}\n'), ("prompts.jsonl:1",)),
    Case("prompt-ids-past-vocab", lambda m: _run_with(m, "--prompt", "1 999999"),
         ("prompt[1]",)),
    Case("prompt-ids-not-ints", lambda m: _run_with(m, "--prompt", "1 two"), ("--prompt",)),

    # an evidence folder holding a damaged file
    Case("evidence-deeply-nested-record", lambda m: _evidence(m, "deep.json", DEEP),
         ("deep.json",)),
    Case("evidence-deeply-nested-manifest", lambda m: _evidence(m, "runs/deep.json", DEEP),
         ("deep.json",)),
    Case("evidence-record-not-utf8", lambda m: _evidence(m, "bad.json", b"\xff\xfe{}"),
         ("bad.json",)),
    Case("evidence-record-a-list", lambda m: _evidence(m, "list.json", "[1, 2]"),
         ("list.json",)),
    Case("evidence-record-truncated", lambda m: _evidence(
        m, "cut.json", next(m.evidence.glob("*.json")).read_text()[:200]), ("cut.json",)),
    Case("evidence-manifest-a-list", lambda m: _evidence(m, "runs/list.json", "[1]"),
         ("list.json",)),
    # an explanation the report cannot read is left out of it, as before: no error, no trace
    Case("evidence-explanation-a-list", lambda m: _evidence(
        m, "forensics/x.explain.json", "[1, 2]"), (), ok=True),
    Case("evidence-explanation-deeply-nested", lambda m: _evidence(
        m, "forensics/x.explain.json", DEEP), (), ok=True),
    Case("report-bench-deeply-nested", lambda m: _report_with(m, "--bench", DEEP), ("--bench",)),
    Case("report-catch-matrix-deeply-nested", lambda m: _report_with(
        m, "--catch-matrix", DEEP), ("--catch-matrix",)),
]


class _Hung(Exception):
    pass


def _alarm(signum, frame):
    raise _Hung(f"no answer within {SECONDS} s")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_ends_in_one_clear_line(case, materials, capsys):
    from harness.cli import main

    argv = case.argv(materials)
    capsys.readouterr()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    start = time.monotonic()
    try:
        if case.ok:
            status, err = main(argv), capsys.readouterr().err
            assert status == 0 and "Traceback" not in err, err
            return
        line = one_line_error(capsys, argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        assert time.monotonic() - start < SECONDS
    for needle in case.needles:
        assert needle in line, line
    assert "remedy:" in line, line
