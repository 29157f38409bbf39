"""GGUF checkpoints through the ``gguf`` package (the format's own library).

Dequantization is ``gguf.quants.dequantize``, the reference implementation of every type
the library knows (F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, the K-quants, ...), to float32;
the package writer rounds once more only when the package is float16. What this module
adds is the plumbing: GGUF's reversed dimension order, the llama.cpp tensor names mapped
to the graph's weight keys, ``[out, in]`` rows turned into ``[in, out]`` matrices, and a
refusal, naming it, of anything the LLaMA graph cannot represent.

RoPE: llama.cpp's converter permuted the ``llama`` Q/K rows so rotation pairs adjacent
channels; those weights are kept as stored and the graph rotates pairs. ``qwen2`` and
``qwen3`` GGUFs were not permuted and rotate halves. Llama 3.x scaling arrives as the
``rope_freqs`` tensor (one divisor per frequency), linear scaling as metadata.

Metadata under ``<arch>.`` must be on ``ARCH_KEYS`` or its family's own keys (read, or
known not to change the forward): an unknown key refuses the file, so a variant is never
converted silently. What differs by family (the Q/K row order, tensors, keys, the features
only its metadata says) is its ``GgufLayout``, found through ``architectures``.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from engines.errors import EngineUnavailable
from harness.convert import errors
from harness.convert.architectures import BY_NAME, GGUF_FAMILIES
from harness.convert.checkpoint import Architecture, Checkpoint
from harness.convert.gguf_architectures import GgufLayout
from engines.gguf_header import field_value, read_metadata
from harness.convert.kinds import COUNT, POSITIVE
from harness.convert.tokenizer_builder import special_ids, tokenizer_from_gguf

# llama.cpp tensor name -> graph weight key (per block: {i})
BLOCK_TENSORS = {
    "attn_norm.weight": "attn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk",
    "attn_v.weight": "wv", "attn_output.weight": "wo", "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
    "attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "attn_output.bias": "bo", "ffn_gate.bias": "b_gate", "ffn_up.bias": "b_up",
    "ffn_down.bias": "b_down",
}
GLOBAL_TENSORS = {"token_embd.weight": "embed", "output_norm.weight": "final_norm",
                  "output.weight": "head"}
# matrices stored [out, in] (GGUF ne reversed) whose graph layout is [in, out]
TRANSPOSED = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "head"}
FUSED = {"fused:qkv": ("wq", "wk", "wv"), "fused:gate_up": ("w_gate", "w_up")}
ROPE_FREQS = "rope_freqs.weight"
# <arch>.* metadata the reader reads, or that does not change the forward
ARCH_KEYS = frozenset({
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base",
    "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "rope.scaling.finetuned", "vocab_size",
})
# what each <arch>.* value the reader uses must be (a family's own keys: its GgufLayout)
VALUE_KINDS = {
    **{key: COUNT for key in ("context_length", "embedding_length", "block_count",
                              "feed_forward_length", "attention.head_count",
                              "attention.head_count_kv", "attention.key_length",
                              "attention.value_length", "rope.dimension_count", "vocab_size")},
    **{key: POSITIVE for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base",
                                 "rope.scaling.factor")},
}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise EngineUnavailable("reading GGUF checkpoints needs the gguf package",
                                field="gguf", value=None,
                                remedy="pip install 'lockstep[real]' (or make real)") from None
    return gguf


class Truncated(Exception):
    """A tensor's data reaches past the end of the file."""


class BadAlignment(Exception):
    """``general.alignment`` is not a uint32 power of two: the tensor data cannot be found."""

    def __init__(self, value):
        self.value = value
        super().__init__(value)


@functools.cache
def _reader_class():
    """``gguf.GGUFReader``, checking each tensor's data extent against the file's size
    before it makes an array of it: a truncated file is then named as one, instead of
    failing in numpy ("cannot reshape array of size 280 into shape (32,64)")."""
    gguf = _gguf()

    class CheckedReader(gguf.GGUFReader):
        def _build_tensor_info(self, offs, count):
            built = super()._build_tensor_info(offs, count)
            field = self.fields.get("general.alignment")  # read right after this
            if field is not None:
                value = field.parts[-1][0].item() if field.parts else None
                if (field.types != [gguf.GGUFValueType.UINT32] or not isinstance(value, int)
                        or value <= 0 or value & (value - 1)):
                    raise BadAlignment(value)
            return built

        def _build_tensors(self, start_offs, fields):
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                kind = gguf.GGMLQuantizationType(int(raw_type[0]))
                block, size = gguf.GGML_QUANT_SIZES[kind]
                count = int(np.prod(dims, dtype=object))  # Python ints: no overflow
                end = int(start_offs + offset[0]) + count * size // block
                if end > len(self.data):
                    raise Truncated(f"tensor {bytes(name).decode('utf-8', 'replace')!r} needs "
                                    f"the file's bytes up to {end}, but the file ends at "
                                    f"{len(self.data)}")
            super()._build_tensors(start_offs, fields)

    return CheckedReader


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` (memory-mapped, read-only), or an InputError if the file is not
    GGUF. The full parse takes seconds on a real vocabulary, and one run opens the same file
    for the scheme, the conversion, the tokenizer and each planted bug: the last few readers
    are kept, by the file's identity (inode, size and modification time, so a file written
    again is read again)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        st = None
    key = None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)
    return _open_gguf(str(path.resolve()), key)


@functools.lru_cache(maxsize=4)
def _open_gguf(path: str, identity: tuple | None):
    path = Path(path)
    try:
        return _reader_class()(str(path))
    except Truncated as exc:
        raise errors.InputError(f"{path.name} is truncated: {exc}", field="checkpoint",
                                value=str(path), remedy="download the checkpoint again (the "
                                "file was cut short)", where=str(path)) from None
    except BadAlignment as exc:
        raise errors.InputError(f"{path.name} declares an alignment its tensor data cannot "
                                f"start on (a uint32 power of two)", field="general.alignment",
                                value=exc.value, remedy="download the checkpoint again, or "
                                "write general.alignment as a power of two (llama.cpp writes "
                                "32)", where=str(path)) from None
    except Exception as exc:  # the reader raises ValueError / struct errors on bad bytes
        raise errors.InputError(f"{path.name} is not a readable GGUF file: {exc}",
                                field="checkpoint", value=str(path),
                                remedy="download the file again if it is damaged; the "
                                       "converter reads .gguf files and Hugging Face folders "
                                       "(config.json + *.safetensors)",
                                where=str(path)) from None


def dequantize_tensor(tensor, where: str = "") -> np.ndarray:
    """One ``ReaderTensor`` as float32 in numpy order (GGUF's ``ne`` reversed)."""
    gguf = _gguf()
    qtype = tensor.tensor_type
    try:
        values = gguf.quants.dequantize(np.asarray(tensor.data), qtype)
    except NotImplementedError:
        raise errors.unsupported_tensor_type(qtype.name, tensor.name, where) from None
    shape = tuple(int(d) for d in reversed([int(x) for x in tensor.shape]))
    return np.ascontiguousarray(values.astype(np.float32, copy=False).reshape(shape))


def declared_architecture(path: str | Path) -> str | None:
    """``general.architecture`` from the header alone (None: not found there); one the
    converter does not read from GGUF is refused before the file is parsed or dequantized."""
    arch = read_metadata(path, {"general.architecture"}).get("general.architecture")
    if arch is not None:
        _check_supported(arch, str(path))
    return arch


def declared_head_dim(path: str | Path, arch: str) -> int | None:
    """The head width the header declares (key length, else width over heads), if it does."""
    keys = [f"{arch}.attention.key_length", f"{arch}.embedding_length",
            f"{arch}.attention.head_count"]
    found = read_metadata(path, set(keys))
    if isinstance(found.get(keys[0]), int):
        return found[keys[0]]
    width, heads = found.get(keys[1]), found.get(keys[2])
    return width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None


def _check_supported(arch, where: str) -> None:
    if arch not in GGUF_FAMILIES:
        raise errors.unsupported_gguf_architecture(str(arch), where)


def layout_of(arch: str) -> GgufLayout:
    """The GGUF layout of a family the converter reads from GGUF (its ``architectures`` row)."""
    return BY_NAME[arch].gguf


def read_architecture(reader, where: str) -> Architecture:
    arch = field_value(reader, "general.architecture")
    _check_supported(arch, where)
    layout = layout_of(arch)

    def need(key: str):
        value = field_value(reader, f"{arch}.{key}")
        if value is None:
            raise errors.InputError(f"the GGUF metadata lacks {arch}.{key}",
                                    field=f"{arch}.{key}", value=None,
                                    remedy="re-export the checkpoint with a current llama.cpp "
                                           "converter", where=where)
        return value

    known = ARCH_KEYS | set(layout.extra_keys)
    for key in sorted(reader.fields):
        if key.startswith(f"{arch}.") and key[len(arch) + 1:] not in known:
            raise errors.InputError(f"the GGUF metadata {key} is not modelled: converting would "
                                    f"risk building a different model", field=key,
                                    value=field_value(reader, key),
                                    remedy="convert a checkpoint without it, or teach "
                                           "harness/convert/gguf_reader.py what it means",
                                    where=where)
    kinds = {**VALUE_KINDS, **{k: v for k, v in layout.extra_keys.items() if v is not None}}
    for key, kind in kinds.items():
        value = field_value(reader, f"{arch}.{key}")
        if value is not None and not kind.ok(value):
            raise errors.InputError(f"the GGUF metadata {arch}.{key} must be {kind.what}",
                                    field=f"{arch}.{key}", value=value,
                                    remedy="re-export the checkpoint with a current llama.cpp "
                                           "converter", where=where)
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(field_value(reader, f"{arch}.attention.head_count_kv", heads))
    if heads % kv_heads:
        raise errors.InputError(f"{heads} query heads cannot share {kv_heads} KV heads in "
                                f"whole groups", field=f"{arch}.attention.head_count_kv",
                                value=kv_heads, remedy=f"use a divisor of {heads}", where=where)
    head_dim = int(field_value(reader, f"{arch}.attention.key_length", hidden // heads))
    if head_dim % 2:
        raise errors.InputError(f"a head of {head_dim} channels cannot be rotated (RoPE turns "
                                f"pairs of channels)", field=f"{arch}.attention.key_length",
                                value=head_dim, remedy="use an even head width", where=where)
    value_dim = int(field_value(reader, f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise errors.InputError("values and keys of different widths are not modelled",
                                field=f"{arch}.attention.value_length", value=value_dim,
                                remedy=f"convert a checkpoint whose value length is {head_dim}",
                                where=where)
    rot = int(field_value(reader, f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise errors.InputError(f"partial rotary embedding ({rot} of {head_dim} channels) is "
                                f"not modelled by the LLaMA graph",
                                field=f"{arch}.rope.dimension_count", value=rot,
                                remedy="convert a checkpoint that rotates every head channel",
                                where=where)
    # the embedding's rows are the vocabulary the graph computes logits over
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise errors.missing_weights(["token_embd.weight"], where)
    layers = int(need("block_count"))
    blocks = {int(m.group(1)) for t in reader.tensors if (m := _BLOCK_NAME.match(t.name))}
    held = max(blocks) + 1 if blocks else 0
    if layers != held:
        raise errors.InputError(f"the metadata declares {layers} blocks, the tensors hold "
                                f"{held} (blk.N tensors)",
                                field=f"{arch}.block_count", value=layers,
                                remedy="convert a complete checkpoint whose metadata belongs to "
                                       "its tensors", where=where)
    vocab = int(embd.shape[1])
    names = {t.name for t in reader.tensors}
    features = {
        "attention_bias": any(n.endswith("attn_q.bias") for n in names),
        "output_bias": any(n.endswith("attn_output.bias") for n in names),
        "mlp_bias": any(n.endswith("ffn_gate.bias") for n in names),
        "qk_norm": "head" if any(n.endswith("attn_q_norm.weight") for n in names) else "none",
        "rope_scaling": _rope_scaling(reader, arch, head_dim, where),
        "sliding_window": _window(reader, arch)}
    if layout.read is not None:  # the family's own reader function
        features.update(layout.read(reader, arch, where))
    return Architecture(
        family=arch, layers=layers, hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, ffn=int(need("feed_forward_length")),
        vocab=int(vocab), context=int(need("context_length")),
        rope_base=float(field_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_layout=layout.rope_layout,
        tied="output.weight" not in names, **features)


def _window(reader, arch: str) -> int | None:
    window = field_value(reader, f"{arch}.attention.sliding_window")
    return int(window) if window else None


def _rope_scaling(reader, arch: str, head_dim: int, where: str) -> tuple | None:
    """Linear scaling from metadata; Llama 3.x's from the rope_freqs tensor."""
    kind = field_value(reader, f"{arch}.rope.scaling.type")
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if kind not in (None, "none", "linear"):
        raise errors.InputError(f"RoPE scaling {kind!r} is not modelled by the LLaMA graph",
                                field=f"{arch}.rope.scaling.type", value=kind,
                                remedy="convert a checkpoint with linear, Llama 3 "
                                       "(rope_freqs) or no RoPE scaling", where=where)
    if kind == "linear" and freqs is not None:
        raise errors.InputError("linear RoPE scaling and rope_freqs together are not modelled",
                                field=f"{arch}.rope.scaling.type", value=kind,
                                remedy="convert a checkpoint with one of the two", where=where)
    if kind == "linear":
        return (("rope_type", "linear"),
                ("factor", float(field_value(reader, f"{arch}.rope.scaling.factor", 1.0))))
    if freqs is None:
        return None
    factors = dequantize_tensor(freqs, where).reshape(-1)
    if factors.size != head_dim // 2:
        raise errors.bad_shape(ROPE_FREQS, factors.shape, (head_dim // 2,), where)
    return (("rope_type", "freq_factors"),
            ("factors", tuple(float(f) for f in factors)))


def weight_key(name: str, arch: str = "llama") -> str | None:
    """llama.cpp tensor name -> graph weight key, or None for a tensor the graph lacks
    (Phi3's fused tensors map to ``fused:...`` keys, split by ``read_weights``)."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    match = _BLOCK_NAME.match(name)
    table = {**BLOCK_TENSORS, **layout_of(arch).block_tensors}
    if match and table.get(match.group(2)) is not None:
        return f"l{int(match.group(1))}.{table[match.group(2)]}"
    return None


def _split_fused(weights: dict, arch: Architecture, where: str) -> None:
    """Phi3: attn_qkv rows are [q | k | v], ffn_up rows [gate | up] (graph layout after the
    transpose: columns)."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    sizes = {"fused:qkv": (q, kv, kv), "fused:gate_up": (arch.ffn, arch.ffn)}
    for key in [k for k in weights if ".fused:" in k]:
        layer, fused = key.split(".", 1)
        value = weights.pop(key)
        if value.shape[1] != sum(sizes[fused]):
            raise errors.bad_shape(key, value.shape, (value.shape[0], sum(sizes[fused])), where)
        start = 0
        for part, size in zip(FUSED[fused], sizes[fused]):
            weights[f"{layer}.{part}"] = np.ascontiguousarray(value[:, start:start + size])
            start += size


def read_weights(reader, arch: Architecture, where: str) -> dict[str, np.ndarray]:
    unknown = [t.name for t in reader.tensors
               if weight_key(t.name, arch.family) is None and t.name != ROPE_FREQS]
    if unknown:
        raise errors.unexpected_tensors(unknown, where)
    weights = {}
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:  # read by read_architecture
            continue
        key = weight_key(tensor.name, arch.family)
        value = dequantize_tensor(tensor, where)
        short = key.split(".")[-1]
        weights[key] = np.ascontiguousarray(value.T) \
            if short in TRANSPOSED or short.startswith("fused:") else value
    _split_fused(weights, arch, where)
    return weights


def read_gguf(path: str | Path, with_tokenizer: bool = True) -> Checkpoint:
    """The whole checkpoint: hyperparameters, float32 weights, tokenizer (if asked)."""
    path = Path(path)
    where = str(path)
    declared_architecture(path)
    reader = open_gguf(path)
    arch = read_architecture(reader, where)
    weights = read_weights(reader, arch, where)
    tokenizer = tokenizer_from_gguf(reader, where) if with_tokenizer else None
    bos, eos = special_ids(reader)
    for key, tid in (("tokenizer.ggml.bos_token_id", bos), ("tokenizer.ggml.eos_token_id", eos)):
        if tid is not None and not 0 <= tid < arch.vocab:
            raise errors.InputError(f"token id {tid} is outside the vocabulary [0, "
                                    f"{arch.vocab})", field=key, value=tid,
                                    remedy="re-export the checkpoint (its special tokens must "
                                           "be ids of its vocabulary)", where=where)
    name = field_value(reader, "general.name") or path.stem
    return Checkpoint(name=str(name), source_kind="gguf", source_path=path, arch=arch,
                      weights=weights, tokenizer=tokenizer, bos_id=bos, eos_id=eos,
                      chat_template=field_value(reader, "tokenizer.chat_template"))
