"""Quantized engines with one planted bug each: what a quantized band must catch.

A band is worth only the bugs it tells from quantization noise. ``lockstep calibrate``
refuses to write a band that does not put each of its engine's mutations at least tenfold
beyond it on some metric, and the catch matrix (``suites/test_planted_bugs.py``) decodes them
under the checked-in band. Each is the honest engine with exactly one thing broken, in the
decode and in teacher-forced scoring alike, the way such engines break:

- ``halves-swapped``: one tensor's values swapped between the two halves of each block (for
  4-bit types the low and high nibble of every byte: a packing-order bug);
- ``block-scale``: one block's scale doubled (a corrupt or misread scale): the block with the
  largest scale of one matrix, a matrix where that block carries enough of the signal to be
  seen (``LLAMA_SCALE_TENSORS``, ``INT4_SCALE_TENSOR``). Most single blocks are not: of the
  28 matrices of layers 0, 1, 2 and 29 tried on llama.cpp, the largest-scale block's doubling
  went tenfold beyond the band in 4 (two corpus segments); of the int4 build's 151
  ``MatMulNBits`` scales (every layer's qkv, o, gate, up and down projections and the LM
  head), scored at the catch matrix's decode positions (its prompts and the honest engine's
  32 tokens, teacher-forced), in 4, and by a wide margin only in layer 9's down projection
  (83x beyond the band; the next 11x; layer 2's, picked before on the corpus alone, 9x). A
  band cannot see every corrupt block, and ``docs/QUANTIZED.md`` says so;
- ``rope-base``: RoPE's frequency base a tenth of the model's (a wrong config key);
- ``kv-shift`` (llama.cpp): the cached positions moved one on, from step ``K`` of a decode
  (position ``SHIFT_AT`` of a scored sequence), through llama.cpp's own sequence-shift call;
- ``bos-dropped``: a prompt's leading BOS not fed (a tokenizer/template bug). It acts only on
  a prompt that starts with the BOS (SmolLM2's is ``<|im_start|>``: its chats do, its text
  does not), and most at the positions next to it.

The weights' bugs are written into a private copy of the checkpoint (a GGUF through
``harness.gguf_rewrite``; an onnxruntime-genai build folder through ``onnx``),
removed when the engine is closed.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from engines.backends.checkpoint_source import CheckpointSource, content_hash, find_checkpoint
from engines.backends.llama_cpp import LlamaCppEngine, gguf_scheme
from engines.backends.ort_genai import OrtGenaiInt4Engine
from engines.errors import InputError
from engines.gguf_header import field_value, tensor_table
from harness.convert.gguf_reader import open_gguf
from harness.gguf_rewrite import Tensor, patch_tensor, rewrite_gguf

K = 3  # the decode step from which kv-shift strikes (as the fixtures' planted bugs)
SHIFT_AT = 16  # the position of a scored sequence from which kv-shift strikes
ROPE_FACTOR = 0.1  # rope-base: the base times this
LLAMA_HALVES_TENSOR = "blk.0.attn_v.weight"
# block-scale, by the file's scheme: Q4_1 (d q + m: doubling d shifts every weight by d q)
# and the symmetric types (d q: doubling d doubles the block), where the bug shows
LLAMA_SCALE_TENSORS = {"ggml-cpu:q4_1": "blk.29.ffn_gate.weight", None: "blk.2.ffn_down.weight"}
INT4_HALVES_TENSOR = "model.layers.0.attn.o_proj.MatMul.weight_Q4"
INT4_SCALE_TENSOR = "model.layers.9.mlp.down_proj.MatMul.weight_scales"
# GGUF block layouts: bytes a block, where its f16 scale and its 4-bit values are
BLOCKS = {"Q4_0": (18, 0, 2), "Q4_1": (20, 0, 4), "Q8_0": (34, 0, None)}


def _type_name(kind: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(kind).name
    except ValueError:
        return f"type {kind}"


def swap_nibbles(values: np.ndarray) -> np.ndarray:
    return ((values >> 4) | (values << 4)).astype(np.uint8)


def _blocks(tensor):
    name = tensor.type.name
    if name not in BLOCKS:
        raise ValueError(f"{tensor.name} is {name}; mutations know {', '.join(BLOCKS)}")
    size, scale, quants = BLOCKS[name]
    data = tensor.data.copy()
    return data, data.reshape(data.shape[0], -1, size), scale, quants


def gguf_halves_swapped(tensor):
    """Every block's two halves exchanged (values 0-15 with 16-31): for a 4-bit type the low
    and high nibble of each byte (a packing-order bug), for Q8_0 the two runs of 16 bytes."""
    data, blocks, _, quants = _blocks(tensor)
    if quants is None:  # Q8_0: one int8 a value, after the scale
        values = blocks[..., 2:].copy()
        blocks[..., 2:] = np.concatenate([values[..., 16:], values[..., :16]], axis=-1)
    else:
        blocks[..., quants:] = swap_nibbles(blocks[..., quants:])
    return data


def gguf_block_scale_doubled(tensor):
    """The block with the largest scale (|d|): its scale doubled."""
    data, blocks, at, _ = _blocks(tensor)
    scales = blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)
    row, block = np.unravel_index(int(np.argmax(np.abs(scales))), scales.shape)
    doubled = np.array([scales[row, block] * 2], dtype=np.float16).view(np.uint8)
    blocks[row, block, at:at + 2] = doubled
    return data


class _PrivateCopy:
    """A temporary folder the engine's mutated checkpoint lives in, removed at close."""

    def _scratch(self) -> Path:
        self._tmp = Path(tempfile.mkdtemp(prefix="lockstep-mutation-"))
        return self._tmp

    @contextlib.contextmanager
    def _removed_on_failure(self):
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        super().close()
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class _DropsBos:
    """A prompt (a scored sequence) that starts with the package's BOS is fed without it."""

    def _drop(self, ids) -> tuple[list[int], int]:
        ids = [int(t) for t in ids]
        bos = self.package.spec.bos_id
        return (ids[1:], 1) if len(ids) > 1 and bos is not None and ids[0] == bos else (ids, 0)

    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False):
        return super().generate(self._drop(prompt)[0], max_new_tokens, audit, ignore_eos)

    def teacher_forced(self, ids, chunk=None):
        fed, dropped = self._drop(ids)
        positions, rows = super().teacher_forced(fed, chunk)
        return [p + dropped for p in positions], rows


# -- llama.cpp -------------------------------------------------------------------------------

class _LlamaWeights(_PrivateCopy, LlamaCppEngine):
    """llama-cpp on a copy of the package's GGUF with ``tensor`` changed by ``mutate``."""

    tensor = ""

    @staticmethod
    def mutate(tensor) -> np.ndarray:  # pragma: no cover - each subclass sets it
        raise NotImplementedError

    @classmethod
    def target(cls, gguf_path) -> str:
        """The tensor to change in the GGUF at ``gguf_path``."""
        return cls.tensor

    @classmethod
    def check_plantable(cls, path: Path, engine: str, given: str) -> None:
        """Refuse, before the minutes of scoring, a GGUF this bug cannot be written into: its
        target tensor absent, or of a type whose blocks it does not know (a float tensor)."""
        target = cls.target(path)
        table = tensor_table(path)
        found = ({name: _type_name(kind) for name, kind, _ in table.tensors} if table else
                 {t.name: t.tensor_type.name for t in open_gguf(path).tensors}).get(target)
        if found not in BLOCKS:
            what = f"holds no tensor {target}" if found is None else f"{target} is {found}"
            raise InputError(f"{engine} cannot be calibrated on {path.name}: {what}, and the "
                             f"planted bug {cls.name} rewrites only {', '.join(BLOCKS)} "
                             f"blocks", field="--package", value=given,
                             remedy=f"calibrate a quantized GGUF ({', '.join(BLOCKS)})")

    def __init__(self, package, **options):
        honest = find_checkpoint(package.root, self.name)
        path = self._scratch() / honest.path.name
        target = self.target(honest.path)
        found = []

        def change(t):
            if t.name != target:
                return None
            found.append(t.name)
            return Tensor(t.name, self.mutate(t), t.type)

        with self._removed_on_failure():
            if not patch_tensor(honest.path, path, target, lambda t: change(t).data):
                rewrite_gguf(honest.path, path, change)  # the full reader's path
            if not found:
                raise ValueError(f"{honest.path.name} has no tensor {target!r} to mutate")
            super().__init__(package, checkpoint=CheckpointSource(path, "gguf",
                                                                  content_hash(path)),
                             **options)


class LlamaHalvesSwapped(_LlamaWeights):
    """llama-cpp with one tensor's 4-bit halves swapped (``blk.0.attn_v.weight``: the low and
    high nibble of every byte)."""
    name = "planted-llama-halves-swapped"
    tensor = LLAMA_HALVES_TENSOR
    mutate = staticmethod(gguf_halves_swapped)


class LlamaBlockScale(_LlamaWeights):
    """llama-cpp with one block's scale doubled: the largest-scale block of the last layer's
    FFN gate (``blk.29.ffn_gate.weight``) in a Q4_1 file, of the third layer's FFN down
    projection (``blk.2.ffn_down.weight``) in a symmetric one (Q4_0, Q8_0)."""
    name = "planted-llama-block-scale"
    mutate = staticmethod(gguf_block_scale_doubled)

    @classmethod
    def target(cls, gguf_path) -> str:
        scheme = gguf_scheme(gguf_path)["numeric_scheme"]
        return LLAMA_SCALE_TENSORS.get(scheme, LLAMA_SCALE_TENSORS[None])


class LlamaRopeBase(LlamaCppEngine):
    """llama-cpp with RoPE's frequency base a tenth of the model's (10,000 for SmolLM2's
    100,000), through llama.cpp's own override."""
    name = "planted-llama-rope-base"

    def options(self):
        base = float(self.llama_metadata("rope.freq_base", 10000.0))
        return {**super().options(), "rope_freq_base": base * ROPE_FACTOR}

    def llama_metadata(self, key: str, default: float) -> float:
        table = tensor_table(self.source.path)
        if table is not None:
            arch = table.metadata.get("general.architecture", "llama")
            return table.metadata.get(f"{arch}.{key}", default)
        reader = open_gguf(self.source.path)
        arch = field_value(reader, "general.architecture", "llama")
        return field_value(reader, f"{arch}.{key}", default)


class LlamaKvShift(LlamaCppEngine):
    """llama-cpp whose cached positions move one on (llama.cpp's sequence shift, +1) after
    step ``K``'s token is chosen: from step ``K`` on every new position sees the cache one
    closer than it is."""
    name = "planted-llama-kv-shift"

    def _shift(self) -> None:
        self.llama._ctx.kv_cache_seq_shift(0, 0, -1, 1)

    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False):
        llama = self.llama
        real = llama.generate

        def shifted(*args, **kwargs):
            stream = real(*args, **kwargs)
            try:
                for n, token in enumerate(stream, 1):
                    yield token
                    if n == K:  # the token is evaluated (at the next position) on resuming
                        self._shift()
            finally:
                stream.close()

        llama.generate = shifted
        try:
            return super().generate(prompt, max_new_tokens, audit, ignore_eos)
        finally:
            del llama.generate

    def teacher_forced(self, ids, chunk=None):
        ids = [int(t) for t in ids]
        llama = self.llama
        llama.reset()
        head, tail = ids[:SHIFT_AT], ids[SHIFT_AT:]
        for part in (head, tail):
            step = len(part) if chunk is None else int(chunk)
            for start in range(0, len(part), max(step, 1)):
                llama.eval(part[start:start + step])
            if part is head and tail:
                self._shift()
        return list(range(len(ids))), np.array(llama.scores[:len(ids)], dtype=np.float32)


class LlamaBosDropped(_DropsBos, LlamaCppEngine):
    """llama-cpp fed a prompt without its leading BOS (a chat prompt's ``<|im_start|>``)."""
    name = "planted-llama-bos-dropped"


# -- onnxruntime-genai int4 ------------------------------------------------------------------

class _Int4Build(_PrivateCopy, OrtGenaiInt4Engine):
    """ort-genai-int4 on a private copy of its build whose graph ``mutate`` changed (the
    reference stays the honest build's dequantized weights)."""

    def mutate(self, initializers: dict) -> None:  # pragma: no cover - each subclass sets it
        raise NotImplementedError

    def __init__(self, package, **options):
        super().__init__(package, **options)
        folder = self._scratch() / self.build.folder.name
        with self._removed_on_failure():
            shutil.copytree(self.build.folder, folder,
                            ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.log"))
            config = json.loads((self.build.folder / "genai_config.json").read_text())
            filename = config["model"]["decoder"]["filename"]
            model = onnx.load(str(self.build.folder / filename))
            inits = {t.name: t for t in model.graph.initializer}
            values = {name: numpy_helper.to_array(t) for name, t in inits.items()}
            for name in self.mutate(values):
                inits[name].CopyFrom(numpy_helper.from_array(values[name], name))
            onnx.save(model, str(folder / filename), save_as_external_data=True,
                      all_tensors_to_one_file=True, location=f"{filename}.data")
            self.model = self.open_model(folder)


class Int4HalvesSwapped(_Int4Build):
    """ort-genai-int4 with one MatMulNBits weight's 4-bit halves swapped (the first layer's
    attention output projection: the low and high nibble of every byte)."""
    name = "planted-int4-halves-swapped"

    def mutate(self, values):
        values[INT4_HALVES_TENSOR] = swap_nibbles(values[INT4_HALVES_TENSOR])
        return [INT4_HALVES_TENSOR]


class Int4BlockScale(_Int4Build):
    """ort-genai-int4 with one block's scale doubled (the largest of the tenth layer's FFN
    down projection, ``model.layers.9.mlp.down_proj``)."""
    name = "planted-int4-block-scale"

    def mutate(self, values):
        scales = values[INT4_SCALE_TENSOR].copy()
        flat = scales.reshape(-1)
        flat[int(np.argmax(np.abs(flat)))] *= 2
        values[INT4_SCALE_TENSOR] = scales
        return [INT4_SCALE_TENSOR]


class Int4RopeBase(_Int4Build):
    """ort-genai-int4 with its rotary tables (``cos_cache``, ``sin_cache``) remade at a tenth
    of the model's RoPE base: the base is read back from the honest table."""
    name = "planted-int4-rope-base"

    def mutate(self, values):
        cos = values["cos_cache"].astype(np.float64)
        positions, half = cos.shape
        # the builder's table: cos(p * base ** (-i / half)); position 1 holds the frequencies
        base = float(np.arccos(np.clip(cos[1, 1], -1.0, 1.0)) ** -half)
        honest = np.cos(np.arange(positions)[:, None] * base ** (-np.arange(half) / half))
        if not np.allclose(honest[:64], cos[:64], atol=1e-4):
            raise ValueError("cos_cache is not cos(p * base ** (-i / half)): rope-base cannot "
                             "remake it")
        angles = np.arange(positions)[:, None] * (base * ROPE_FACTOR) ** (
            -np.arange(half) / half)
        values["cos_cache"] = np.cos(angles).astype(values["cos_cache"].dtype)
        values["sin_cache"] = np.sin(angles).astype(values["sin_cache"].dtype)
        return ["cos_cache", "sin_cache"]


class Int4BosDropped(_DropsBos, OrtGenaiInt4Engine):
    """ort-genai-int4 fed a prompt without its leading BOS."""
    name = "planted-int4-bos-dropped"


MUTATIONS: dict[str, tuple[type, ...]] = {
    "llama-cpp": (LlamaHalvesSwapped, LlamaBlockScale, LlamaRopeBase, LlamaKvShift,
                  LlamaBosDropped),
    "ort-genai-int4": (Int4HalvesSwapped, Int4BlockScale, Int4RopeBase, Int4BosDropped),
}


def mutations_for(engine: str) -> tuple[type, ...]:
    """The planted-bug engines a band of ``engine`` must catch (none: calibrate refuses)."""
    return MUTATIONS.get(engine, ())


def check_plantable(mutations, engine, given: str) -> None:
    """Each planted bug that rewrites the open ``engine``'s GGUF can be written into it
    (``given``: the --package the user named)."""
    for cls in mutations:
        if issubclass(cls, _LlamaWeights):
            cls.check_plantable(engine.source.path, engine.name, given)


__all__ = ["MUTATIONS", "check_plantable", "mutations_for"]
