"""Kernels for the ``lockstep.fused`` nodes the fusion pass (``engines.native.fusion``)
writes: one node where the converter's graph has a chain of them.

Each kernel has two implementations. The array one (``be.xp``, ``be.sum``, ``be.matmul``)
repeats the unfused nodes' arithmetic call for call, so native-host computes bit for bit
what the unfused plan computes; attention and the KV write read ``positions`` there, so
the array path serves the host only for those two. On a CuPy backend each node is one
hand-written kernel (``engines.native.fused_kernels``): batch-invariant, capture-safe, on
the backend's stream, and within the tolerance table of the host.

The contract shared by both: ``positions`` within one forward are distinct, and a slot a
static cache has not written holds finite values (the zeros it starts with, or rows a
rejected speculation left): a masked key then contributes exactly nothing.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx
from onnx import helper

from engines.native.dtype_names import dtype_name
from engines.native.fusion.rotary_kv_attention import PREFIX as ATTENTION_PREFIX

from .base import Kernel
from .cast import cast_to
from .nn import Softmax

DOMAIN = "lockstep.fused"


def _np(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(elem_type)))


def _device(be, *arrays):
    """The backend's fused CUDA kernels, or None on the host (and on test fakes), and where
    an operand's dtype has no kernel (float64, say: the array path serves it)."""
    if be.residency == "host":
        return None
    from engines.native.cupy_array_backend import CupyArrayBackend
    from engines.native.launch.fused_dtypes import FUSED_DTYPES

    if not isinstance(be, CupyArrayBackend):
        return None
    if any(dtype_name(a.dtype) not in FUSED_DTYPES for a in arrays):
        return None
    return be.fused_kernels()


class _Fused(Kernel):
    domain: ClassVar[str] = DOMAIN

    def scalar(self, prefix: str) -> np.ndarray | None:
        """The graph's 0-d constant, rebuilt exactly (value and dtype) from the attributes."""
        elem = int(self.attr(f"{prefix}_type", 0))
        if not elem:
            return None
        return np.asarray(self.attr(prefix), dtype=_np(elem))

    def cast(self, be, x, to: int):
        return cast_to(be, x, to, _np(to), True, "up") if to else x

    def need_rank(self, x, rank: int, what: str) -> None:
        if x.ndim != rank:
            raise self.fail(f"{what} must have rank {rank}", field=f"{self.node.op_type}.{what}",
                            value=tuple(x.shape),
                            remedy="run this model unfused (Plan(..., fuse=False)) and report "
                                   "the graph: the recogniser matched a shape it cannot take")


class RMSNorm(_Fused):
    """x * (1 / sqrt(mean(x * x) + eps)) * gain over the last axis, then the folded Cast."""

    def setup(self) -> None:
        self.eps = self.scalar("epsilon")
        self.to = int(self.attr("to", 0))

    def __call__(self, be, x, gain):
        device = _device(be, x, gain)
        if device is not None and gain.dtype == x.dtype and gain.shape == x.shape[-1:]:
            return (device.rms_norm(x, gain, float(self.eps),
                                    _np(self.to) if self.to else x.dtype, stream=be.stream),)
        xp = be.xp
        total = be.sum(xp.multiply(x, x), x.ndim - 1, keepdims=True)
        mean = total / total.dtype.type(x.shape[-1])  # ReduceMean's arithmetic
        inv = xp.reciprocal(xp.sqrt(xp.add(mean, self.eps)))
        return (self.cast(be, xp.multiply(xp.multiply(x, inv), gain), self.to),)


class AddRMSNorm(RMSNorm):
    """residual + delta (after the folded Cast up of delta), and RMSNorm of that sum: two
    outputs, the sum (the residual stream goes on) and the normed row."""

    def setup(self) -> None:
        super().setup()
        self.up = int(self.attr("up", 0))

    def __call__(self, be, residual, delta, gain):
        device = _device(be, residual, delta, gain)
        summed = _np(self.up) if self.up else delta.dtype
        if device is not None and residual.shape == delta.shape and summed == residual.dtype \
                and gain.dtype == residual.dtype and gain.shape == residual.shape[-1:]:
            return device.add_rms_norm(residual, delta, gain, float(self.eps),
                                       _np(self.to) if self.to else residual.dtype,
                                       stream=be.stream)
        total = be.xp.add(residual, self.cast(be, delta, self.up))
        return (total,) + super().__call__(be, total, gain)


class NormMatMul(AddRMSNorm):
    """An RMSNorm (after a residual add when ``add``) whose normed row is read only by
    MatMuls of 2-D weights (q/k/v, gate/up, the head): outputs the sum (when ``add``), then
    each weight's product, each bit for bit what the norm's and the MatMuls' own nodes give.
    On the device decode and verify rows are one launch (the norm as the GEMV's prologue);
    elsewhere the norm runs, then the MatMuls."""

    def setup(self) -> None:
        super().setup()
        self.add = int(self.attr("add", 0))

    def __call__(self, be, *inputs):
        got = self.one_launch(be, inputs,
                              lambda device, *args, stream: device.norm_gemv(*args, stream=stream))
        if got is not None:
            return got
        norm_in, weights = self.split(inputs)
        normed = (AddRMSNorm.__call__(self, be, *norm_in) if self.add
                  else RMSNorm.__call__(self, be, *norm_in))
        return normed[:-1] + _products(be, normed[-1], weights)

    def split(self, inputs) -> tuple[tuple, list]:
        """(the norm's inputs, the weights)."""
        lead = 3 if self.add else 2
        return tuple(inputs[:lead]), list(inputs[lead:])

    def one_launch(self, be, inputs, launch):
        """``launch(device, residual, delta, gain, eps, out dtype, cached weights, stream=)``
        where the device kernels take the norm (its sum kept in the residual's dtype), else
        None."""
        norm_in, weights = self.split(inputs)
        residual, gain = norm_in[0], norm_in[-1]
        delta = norm_in[1] if self.add else None
        device = _device(be, *norm_in)
        summed = _np(self.up) if self.up else (delta.dtype if self.add else residual.dtype)
        if device is None or summed != residual.dtype:
            return None
        out = _np(self.to) if self.to else residual.dtype
        cached = be.cached_transposes(weights, out)
        if cached is None:
            return None
        return launch(device, residual, delta, gain, float(self.eps), out, cached,
                      stream=be.stream)


class NormGLU(NormMatMul):
    """A NormMatMul over gate and up whose two products only a SwiGLU reads (``glu_up``,
    ``glu_to``: SwiGLU's Casts): outputs the sum (when ``add``), then SwiGLU of the pair, bit
    for bit the NormMatMul's and the SwiGLU's own nodes. On the device decode and verify rows
    are one launch (a block computes gate and up column n together and stores their SwiGLU);
    elsewhere NormMatMul runs, then SwiGLU."""

    def setup(self) -> None:
        super().setup()
        self.glu_up = int(self.attr("glu_up", 0))
        self.glu_to = int(self.attr("glu_to", 0))

    def __call__(self, be, *inputs):
        got = self.one_launch(be, inputs, self._norm_glu)
        if got is not None:
            return got
        *summed, gate, up = NormMatMul.__call__(self, be, *inputs)
        return tuple(summed) + (swiglu(self, be, gate, up, self.glu_up, self.glu_to),)

    def _norm_glu(self, device, residual, delta, gain, eps, out, cached, *, stream):
        compute = _np(self.glu_up) if self.glu_up else out
        glu_out = _np(self.glu_to) if self.glu_to else compute
        return device.norm_glu(residual, delta, gain, eps, out, cached, compute, glu_out,
                               stream=stream)


def _products(be, a, weights) -> tuple:
    """MatMulN's arithmetic: each ``a @ w``, in one launch on the device where it can."""
    if len(weights) > 1 and _device(be, a, *weights) is not None:
        return tuple(be.matmul_many(a, weights))
    return tuple(be.matmul(a, w) for w in weights)


class Rotary(_Fused):
    """x * cos + rotate(x) * sin on [B, heads, M, 2 * half] (after the folded Cast up),
    then the folded scale and Cast down; ``rotate`` maps a pair (a, b) to (-b, a)."""

    def setup(self) -> None:
        self.layout = self.attr("layout", "halves")
        self.half = int(self.attr("half"))
        self.up = int(self.attr("up", 0))
        self.to = int(self.attr("to", 0))
        self.scale_value = self.scalar("scale")

    def __call__(self, be, x, cos, sin):
        self.check(x)
        device = _device(be, x, cos, sin)
        if device is not None and self.on_device(x, cos, sin, self.scale_value):
            compute, out = self.dtypes(x)
            return (device.rotary(x, cos, sin, self.layout, compute,
                                  _float(self.scale_value), out, stream=be.stream),)
        return (self.rotate(be, x, cos, sin, self.scale_value),)

    def check(self, x) -> None:
        self.need_rank(x, 4, "x")
        if x.shape[3] != 2 * self.half:
            raise self.fail("the rotated axis does not match the recognised head_dim",
                            field=f"{self.node.op_type}.x", value=tuple(x.shape),
                            remedy=f"feed head_dim {2 * self.half}, or run unfused")

    def dtypes(self, x) -> tuple[np.dtype, np.dtype]:
        """(compute, output) dtypes: after the folded Cast up, and after the Cast down."""
        compute = _np(self.up) if self.up else x.dtype
        return compute, (_np(self.to) if self.to else compute)

    def on_device(self, x, cos, sin, scale) -> bool:
        """Whether the CUDA kernel computes what the graph does: tables and scale in the
        compute dtype (else the array path runs)."""
        compute, _ = self.dtypes(x)
        return cos.dtype == compute and sin.dtype == compute and (
            scale is None or scale.dtype == compute)

    def rotate(self, be, x, cos, sin, scale):
        """The unfused nodes' arithmetic, call for call."""
        xp = be.xp
        x = self.cast(be, x, self.up)
        h = self.half
        if self.layout == "pairs":
            split = xp.reshape(x, x.shape[:3] + (h, 2))
            rot = xp.concatenate((xp.negative(split[..., 1:2]), split[..., 0:1]), axis=4)
            rot = xp.reshape(rot, x.shape[:3] + (2 * h,))
        else:
            rot = xp.concatenate((xp.negative(x[..., h:2 * h]), x[..., 0:h]), axis=3)
        y = xp.add(xp.multiply(x, cos), xp.multiply(rot, sin))
        if scale is not None:
            y = xp.multiply(y, scale)
        return self.cast(be, y, self.to)


class Rotary2(Rotary):
    """Two rotations over the same cos/sin (a layer's queries and keys), each exactly
    ``Rotary``'s, with its own scale (``scale_a``, ``scale_b``): one launch on the device."""

    def setup(self) -> None:
        super().setup()
        self.scale_a, self.scale_b = self.scalar("scale_a"), self.scalar("scale_b")

    def __call__(self, be, xa, xb, cos, sin):
        self.check(xa)
        self.check(xb)
        device = _device(be, xa, xb, cos, sin)
        if device is not None and xa.dtype == xb.dtype \
                and self.on_device(xa, cos, sin, self.scale_a) \
                and self.on_device(xb, cos, sin, self.scale_b):
            compute, out = self.dtypes(xa)
            return device.rotary2(xa, xb, cos, sin, self.layout, compute,
                                  _float(self.scale_a), _float(self.scale_b), out,
                                  stream=be.stream)
        return (self.rotate(be, xa, cos, sin, self.scale_a),
                self.rotate(be, xb, cos, sin, self.scale_b))


class RotaryKVWrite(Rotary2):
    """A layer's Rotary2 whose rotated keys only its static-cache KVWrite2 reads: inputs
    (x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain, positions), outputs (the
    kept rotation, the cache of the rotated rows, the other cache), each bit for bit the two
    nodes'. One launch on the device where it can take the operands; else the rotation,
    then the write."""

    def setup(self) -> None:
        super().setup()
        self.max_context = int(self.attr("max_context"))

    def one_launch(self, x_keep, x_cache, cos, sin, old_rot) -> bool:
        """Whether the device's one-launch kernels compute what the two nodes do: both
        rotations in one dtype, their tables and scales in the compute dtype, a cache of
        the recognised length."""
        return (x_keep.dtype == x_cache.dtype and old_rot.ndim == 4
                and old_rot.shape[2] == self.max_context
                and self.on_device(x_keep, cos, sin, self.scale_a)
                and self.on_device(x_cache, cos, sin, self.scale_b))

    def __call__(self, be, x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain,
                 positions):
        self.check(x_keep)
        self.check(x_cache)
        device = _device(be, x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain)
        if device is not None and self.one_launch(x_keep, x_cache, cos, sin, old_rot):
            compute, out = self.dtypes(x_keep)
            got = device.rotary_kv(x_keep, x_cache, cos, sin, self.layout, compute,
                                   _float(self.scale_a), _float(self.scale_b), out, old_rot,
                                   old_plain, new_plain, positions, stream=be.stream)
            if got is not None:
                return got
        return self.two_nodes(be, x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain,
                              positions)

    def two_nodes(self, be, x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain,
                  positions) -> tuple:
        """The rotation, then the write: the two nodes' own kernels."""
        kept, rotated = Rotary2.__call__(self, be, x_keep, x_cache, cos, sin)
        return (kept,) + KVWrite2.write(self, be, old_rot, rotated, old_plain, new_plain,
                                        positions)


def _float(value) -> float | None:
    return None if value is None else float(value)


class SwiGLU(_Fused):
    """gate * sigmoid(gate) * up (after the folded Casts up), then the folded Cast down;
    sigmoid split by sign as the Sigmoid kernel does."""

    def setup(self) -> None:
        self.up = int(self.attr("up", 0))
        self.to = int(self.attr("to", 0))

    def __call__(self, be, gate, up):
        return (swiglu(self, be, gate, up, self.up, self.to),)


def swiglu(kernel: _Fused, be, gate, up, up_to: int, to: int):
    """SwiGLU's arithmetic with its Casts (``up_to`` before, ``to`` after; 0: none): one
    launch on the device, the unfused ops' arithmetic call for call elsewhere."""
    device = _device(be, gate, up)
    if device is not None and gate.dtype == up.dtype and gate.shape == up.shape:
        compute = _np(up_to) if up_to else gate.dtype
        return device.swiglu(gate, up, compute, _np(to) if to else compute, stream=be.stream)
    xp = be.xp
    g, u = kernel.cast(be, gate, up_to), kernel.cast(be, up, up_to)
    e = xp.exp(-xp.abs(g))
    one = g.dtype.type(1)
    sig = xp.where(g >= 0, one / (one + e), e / (one + e))
    return kernel.cast(be, xp.multiply(xp.multiply(g, sig), u), to)


class SwiGLUMatMul(SwiGLU):
    """SwiGLU whose product only the MatMul by a 2-D weight (the down projection) reads: its
    output bit for bit the two nodes'. On the device decode and verify rows are one launch
    (SwiGLU as the GEMV's prologue); elsewhere SwiGLU runs, then the MatMul."""

    def __call__(self, be, gate, up, weight):
        device = _device(be, gate, up)
        if device is not None and gate.dtype == up.dtype and gate.shape == up.shape:
            compute = _np(self.up) if self.up else gate.dtype
            out = _np(self.to) if self.to else compute
            cached = be.cached_transposes([weight], out)
            if cached is not None:
                got = device.swiglu_gemv(gate, up, compute, out, cached[0], stream=be.stream)
                if got is not None:
                    return (got,)
        (product,) = super().__call__(be, gate, up)
        return (be.matmul(product, weight),)


class KVWrite(_Fused):
    """A copy of the cache ``old`` [B, kv_heads, C, head_dim] whose slot p holds the row of
    ``new`` [B, kv_heads, M, head_dim] written at position p (p in [0, C); others are
    skipped, as the one-hot skips them). The row is stored as ``row + 0``: the one-hot
    product's sum turns -0 into +0, and so does this."""

    def setup(self) -> None:
        self.max_context = int(self.attr("max_context"))

    def __call__(self, be, old, new, positions):
        self.need_rank(old, 4, "old")
        self.need_rank(new, 4, "new")
        if old.shape[2] != self.max_context:
            raise self.fail("the cache's slot axis does not match the one-hot's slots",
                            field="KVWrite.old", value=tuple(old.shape),
                            remedy=f"feed a cache with {self.max_context} slots")
        device = _device(be)
        if device is not None:
            return (device.kv_write(old, new, positions, stream=be.stream),)
        xp = be.xp
        out = xp.array(old, copy=True)
        zero = old.dtype.type(0)
        for m, p in enumerate(np.asarray(positions).reshape(-1).tolist()):
            if 0 <= p < self.max_context:
                out[:, :, p, :] = xp.add(new[:, :, m, :], zero)
        return (out,)


class KVWrite2(KVWrite):
    """Two KV writes at the same positions (a layer's keys and values): two outputs, each
    exactly ``KVWrite``'s."""

    def __call__(self, be, old_a, new_a, old_b, new_b, positions):
        return self.write(be, old_a, new_a, old_b, new_b, positions)

    def write(self, be, old_a, new_a, old_b, new_b, positions):
        """The two writes (``RotaryKVWrite`` runs this too, on its own attributes)."""
        for value, what in ((old_a, "old_a"), (new_a, "new_a"), (old_b, "old_b"),
                            (new_b, "new_b")):
            self.need_rank(value, 4, what)
        device = _device(be, old_a, old_b)
        if device is not None and old_a.shape[2] == old_b.shape[2] == self.max_context:
            return device.kv_write2(old_a, new_a, old_b, new_b, positions, stream=be.stream)
        return (KVWrite.__call__(self, be, old_a, new_a, positions)
                + KVWrite.__call__(self, be, old_b, new_b, positions))


class MatMulN(_Fused):
    """``a @ w_i`` for each weight (sibling MatMuls of one activation): each output exactly
    its own MatMul's; one launch on the device where the backend can."""

    def __call__(self, be, a, *weights):
        return _products(be, a, list(weights))


class Attention(_Fused):
    """Causal grouped-query attention: query row m (position p) reads key slots j <= p of
    KV head h // group; out [1, M, heads * head_dim]. Uniform graphs scale the scores by
    ``scale`` in their own dtype; mixed ones cast the scores up (q arrives scaled) and the
    probabilities down. Slots past the largest position are never read: their masked
    scores would add exact zeros."""

    def setup(self) -> None:
        self.kv_heads = int(self.attr("kv_heads"))
        self.group = int(self.attr("group"))
        self.head_dim = int(self.attr("head_dim"))
        self.scale_value = self.scalar("scale")
        self.masked = self.scalar("masked")
        self.up = int(self.attr("up", 0))
        self.down = int(self.attr("down", 0))

    def __call__(self, be, q, k_all, v_all, positions):
        for value, what in ((q, "q"), (k_all, "k_all"), (v_all, "v_all")):
            self.need_rank(value, 4, what)
        device = _device(be)
        if device is not None:
            score = _np(self.up) if self.up else q.dtype
            scale = None if self.scale_value is None else float(self.scale_value)
            return (device.attention(q, k_all, v_all, positions, self.kv_heads, self.group,
                                     scale, score, stream=be.stream),)
        xp = be.xp
        heads, d = self.kv_heads * self.group, self.head_dim
        extent = k_all.shape[2]
        pos = np.asarray(positions).reshape(-1)
        valid = extent if pos.size == 0 or pos.min() < 0 else min(extent, int(pos.max()) + 1)
        q5 = xp.reshape(q, (1, self.kv_heads, self.group, -1, d))
        k5 = xp.transpose(xp.expand_dims(k_all[:, :, :valid, :], 2), (0, 1, 2, 4, 3))
        scores = be.matmul(q5, k5)
        if self.scale_value is not None:
            scores = xp.multiply(scores, self.scale_value)
        else:
            scores = self.cast(be, scores, self.up)
        visible = xp.less_equal(np.arange(valid, dtype=np.int64),
                                xp.expand_dims(positions, (1, 2, 4)))
        probs = Softmax.along(be, xp.where(visible, scores, self.masked), 4)
        probs = self.cast(be, probs, self.down)
        ctx = be.matmul(probs, xp.expand_dims(v_all[:, :, :valid, :], 2))
        ctx = xp.reshape(ctx, (1, heads, -1, d))
        ctx = xp.transpose(ctx, (0, 2, 1, 3))
        return (xp.reshape(ctx, (ctx.shape[0], ctx.shape[1], heads * d)),)


class RotaryKVAttention(_Fused):
    """A RotaryKVWrite whose rotated queries only its Attention reads, and whose two caches
    that attention reads: RotaryKVWrite's inputs; outputs (key cache, value cache, attention
    output), each bit for bit the two nodes'. The node carries both nodes' attributes (the
    attention's prefixed ``att_``) and rebuilds both kernels. On the device, decode and
    verification rows are one launch where it can take the operands; otherwise, and on the
    host, the two kernels run."""

    def setup(self) -> None:
        own, att = [], []
        for a in self.node.attribute:
            if a.name.startswith(ATTENTION_PREFIX):
                renamed = onnx.AttributeProto()
                renamed.CopyFrom(a)
                renamed.name = a.name[len(ATTENTION_PREFIX):]
                att.append(renamed)
            else:
                own.append(a)
        write = helper.make_node("RotaryKVWrite", list(self.node.input), ["kept", "k", "v"],
                                 name=self.node.name, domain=DOMAIN)
        write.attribute.extend(own)
        attention = helper.make_node("Attention", ["kept", "k", "v", self.node.input[7]],
                                     ["out"], name=self.node.name, domain=DOMAIN)
        attention.attribute.extend(att)
        self.write = RotaryKVWrite(write, self.opset)
        self.attention = Attention(attention, self.opset)

    def __call__(self, be, x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain,
                 positions):
        write, attention = self.write, self.attention
        write.check(x_keep)
        write.check(x_cache)
        device = _device(be, x_keep, x_cache, cos, sin, old_rot, old_plain, new_plain)
        got = None
        if device is not None and write.one_launch(x_keep, x_cache, cos, sin, old_rot):
            compute, out = write.dtypes(x_keep)
            score = _np(attention.up) if attention.up else out
            scale = (None if attention.scale_value is None
                     else float(attention.scale_value))
            got = device.rotary_kv_attention(
                x_keep, x_cache, cos, sin, write.layout, compute, _float(write.scale_a),
                _float(write.scale_b), out, old_rot, old_plain, new_plain, positions,
                attention.kv_heads, attention.group, scale, score, stream=be.stream)
            if got is not None:
                return got
            # a prefill: RotaryKVWrite's own launch, its checks already made here
            got = device.rotary_kv(x_keep, x_cache, cos, sin, write.layout, compute,
                                   _float(write.scale_a), _float(write.scale_b), out, old_rot,
                                   old_plain, new_plain, positions, stream=be.stream)
        if got is None:
            got = write.two_nodes(be, x_keep, x_cache, cos, sin, old_rot, old_plain,
                                  new_plain, positions)
        kept, cache_k, cache_v = got
        return (cache_k, cache_v) + attention(be, kept, cache_k, cache_v, positions)


def prepare(be) -> None:
    """Compile and load the device kernels now, while the plan builds: a module cannot be
    loaded inside a CUDA graph capture. Nothing to do on the host."""
    _device(be)
