"""onnxruntime's mixture-of-experts ops: com.microsoft MoE and QMoE (its weight-quantised
form), with the semantics of onnxruntime's CPU kernel, the ops' defining implementation.

Routing, per token row, in float32: the k experts of largest score, ties to the *higher*
expert index (onnxruntime sorts (score, index) pairs descending). MoE scores by the softmax
over every expert and weights each chosen expert by its probability (divided by the k
probabilities' sum when ``normalize_routing_weights`` is set); QMoE scores by the logits
and weights by the softmax over the k chosen logits alone (always normalised), or by
``router_weights`` where given. An expert's output is fc2(act(fc1(x))); the token's output
is the weighted sum over its experts in expert order.

Batch invariance and the device: every expert runs over every row (dense: E times the FFN
work, so nothing depends on which rows chose which expert) and a row's unchosen experts
add exact zeros, so row i of an M-row call is the M=1 call's bits and no data-dependent
shape exists (no gather of the rows an expert got, nothing read back). Products go through
``be.matmul``, the selection through comparisons of the probabilities. 16-bit inputs
compute in float32 and round once.

QMoE's weights are dequantised exactly as the op defines, (q - zero_point) * scale.
onnxruntime's CPU kernel takes faster, inexact paths by default: its 4-bit MLAS Q4 GEMM
requantises weights that have zero points to its own symmetric blocks (off by whole
quantisation steps; ``ORT_USE_MLAS_Q4_GEMM_MOE=0`` keeps the exact path, which the tests
use), and block-wise 8-bit experts whose scales are initializers run with int8 activations
(as MatMulNBits' accuracy level 4 does). A package judged on ort-cpu meets those.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Kernel
from .elementwise import sigmoid
from .quantized import unpack

ACTIVATIONS = ("relu", "gelu", "silu", "identity", "swiglu")


class _MixtureOfExperts(Kernel):
    domain = "com.microsoft"

    def setup(self) -> None:
        self.k = int(self.attr("k", 1))
        self.activation = self.attr("activation_type", "relu")
        self.normalize = bool(self.attr("normalize_routing_weights", 0))
        self.fusion = int(self.attr("swiglu_fusion", 0))
        self.alpha = float(self.attr("activation_alpha", 1.0))
        self.beta = float(self.attr("activation_beta", 0.0))
        limit = self.attr("swiglu_limit")
        self.limit = None if limit is None else float(limit)
        if self.activation not in ACTIVATIONS:
            raise self.fail("unsupported MoE activation", field="activation_type",
                            value=self.activation,
                            remedy=f"use one of {', '.join(ACTIVATIONS)} (relu2 and geglu are "
                                   f"CUDA-only in onnxruntime), or run on ort-cpu")
        if self.k < 1:
            raise self.fail("k must be at least 1", field="k", value=self.k,
                            remedy="route each token to k >= 1 experts")
        if int(self.attr("use_sparse_mixer", 0)):
            raise self.fail("the sparse mixer routing is not supported", field="use_sparse_mixer",
                            value=1, remedy="export with use_sparse_mixer=0, or run on ort-cpu")
        if int(self.attr("swiglu_limit_after_activation", 0)):
            raise self.fail("clamping after the activation is not supported",
                            field="swiglu_limit_after_activation", value=1,
                            remedy="export with swiglu_limit_after_activation=0")
        if self.activation == "swiglu" and self.fusion not in (0, 1, 2):
            raise self.fail("unknown swiglu_fusion", field="swiglu_fusion", value=self.fusion,
                            remedy="use 0 (fc1 gate, fc3 up), 1 (interleaved) or 2 (concatenated)")

    # ---- routing -------------------------------------------------------------------------

    def chosen(self, be, scores):
        """[rows, E] bool: the k experts of largest score in each row, ties to the higher
        expert index (the experts ahead of j: larger score, or equal and a higher index)."""
        xp = be.xp
        experts = scores.shape[-1]
        if self.k > experts:
            raise self.fail("k is larger than the number of experts", field="k",
                            value=(self.k, experts), remedy=f"use k <= {experts}")
        mine, other = scores[:, :, None], scores[:, None, :]
        index = xp.arange(experts)
        higher = (index[None, :] > index[:, None])[None]
        ahead = (other > mine) | ((other == mine) & higher)
        return be.sum(ahead.astype(np.int32), 2) < self.k

    @staticmethod
    def softmax(be, z, allowed=None):
        xp = be.xp
        if allowed is not None:
            z = xp.where(allowed, z, np.float32(-np.inf))
        e = xp.exp(z - xp.max(z, axis=-1, keepdims=True))
        return e / be.sum(e, e.ndim - 1, keepdims=True)

    def routing(self, be, logits, weights=None):
        """[rows, E] mixing weights, zero where an expert is not among a row's k: MoE's
        softmax over every expert, its k largest kept (normalised if asked)."""
        xp = be.xp
        probs = self.softmax(be, logits.astype(np.float32))
        chosen = self.chosen(be, probs)
        mix = xp.where(chosen & (probs > 0), probs, np.float32(0))
        if self.normalize:
            mix = mix / be.sum(mix, 1, keepdims=True)
        return mix

    # ---- experts -------------------------------------------------------------------------

    def activate(self, xp, h):
        t = h.dtype.type
        if self.activation == "relu":
            return xp.maximum(h, t(0))
        if self.activation == "silu":
            return h * sigmoid(xp, h)
        if self.activation == "gelu":  # the tanh form, as onnxruntime's CPU MoE computes it
            inner = t(math.sqrt(2 / math.pi)) * (h + t(0.044715) * h * h * h)
            return t(0.5) * h * (t(1) + xp.tanh(inner))
        return h

    def swiglu(self, xp, gate, up):
        t = gate.dtype.type
        if self.limit is not None:
            gate = xp.minimum(gate, t(self.limit))
            up = xp.clip(up, t(-self.limit), t(self.limit))
        return gate * sigmoid(xp, gate * t(self.alpha)) * (up + t(self.beta))

    def ffn(self, be, x, w1, b1, w2, b2, w3, b3):
        """One expert over every row: x [rows, H], w1 [F, H], w2 [H, I], w3 [I, H]."""
        xp = be.xp
        h = be.matmul(x, w1.T)
        if b1 is not None:
            h = h + b1
        if self.activation != "swiglu":
            h = self.activate(xp, h)
        elif w3 is not None:  # fusion 0: fc1 the gate, fc3 the up projection
            up = be.matmul(x, w3.T)
            h = self.swiglu(xp, h, up if b3 is None else up + b3)
        elif self.fusion == 1:
            h = self.swiglu(xp, h[:, 0::2], h[:, 1::2])
        else:
            half = h.shape[1] // 2
            h = self.swiglu(xp, h[:, :half], h[:, half:])
        y = be.matmul(h, w2.T)
        return y if b2 is None else y + b2

    def mix(self, be, x, logits, weights, router_weights=None):
        """x [.., H] through the chosen experts. ``weights``: fc1, b1, fc2, b2, fc3, b3 as
        arrays with the experts first (or None), in any float dtype."""
        xp = be.xp
        w1, b1, w2, b2, w3, b3 = weights
        if w3 is not None and self.activation != "swiglu":
            raise self.fail("fc3 weights only serve swiglu's up projection here",
                            field="fc3_experts_weights", value=self.activation,
                            remedy="use activation_type=swiglu with swiglu_fusion=0, or drop fc3")
        if self.activation == "swiglu" and self.fusion == 0 and w3 is None:
            raise self.fail("swiglu_fusion=0 takes the up projection from fc3",
                            field="fc3_experts_weights", value=None,
                            remedy="wire fc3_experts_weights, or set swiglu_fusion to 1 or 2")
        hidden = x.shape[-1]
        rows = x.reshape(-1, hidden)
        routes = logits.reshape(-1, logits.shape[-1])
        if routes.shape[0] != rows.shape[0]:
            raise self.fail("router_probs needs one row per token", field="router_probs.shape",
                            value=(tuple(logits.shape), tuple(x.shape)),
                            remedy=f"give router_probs {rows.shape[0]} rows")
        mix = self.routing(be, routes, router_weights)
        dtype = np.dtype(np.float32) if x.dtype.itemsize < 4 else x.dtype
        a = rows.astype(dtype)
        out = xp.zeros(a.shape, dtype=dtype)
        for e in range(routes.shape[1]):
            y = self.ffn(be, a, *(None if w is None else w[e].astype(dtype, copy=False)
                                  for w in weights))
            weight = mix[:, e:e + 1].astype(dtype)
            out = out + xp.where(weight > 0, weight * y, dtype.type(0))
        return out.reshape(x.shape).astype(x.dtype, copy=False)


class MoE(_MixtureOfExperts):
    """fc1 [E, F * I, H] (F = 2 for a fused swiglu), fc2 [E, H, I], fc3 [E, I, H] (swiglu
    with fusion 0), biases [E, rows]."""

    def __call__(self, be, x, router, w1, b1=None, w2=None, b2=None, w3=None, b3=None):
        return (self.mix(be, x, router, (w1, b1, w2, b2, w3, b3)),)


class QMoE(_MixtureOfExperts):
    """Integer-quantised experts (quant_type ``int``, raw layout): weights uint8
    [E, N, K * bits / 8], each row's K values packed low bits first; scales [E, N] (a row
    each) or [E, N, K / block_size]; zero points packed the same way (default 2^(bits-1));
    W = (q - zero_point) * scale, dequantised once per weight and kept. fp4/fp8 schemes, the
    3-bit profile and prepacked layouts are refused by name."""

    REFUSED_INPUTS = {15: "fc1_global_scale", 16: "fc2_global_scale", 17: "fc1_act_scale",
                      18: "fc2_act_scale", 19: "fc1_act_block_scale",
                      20: "fc2_act_block_scale"}

    def setup(self) -> None:
        super().setup()
        quant = self.attr("quant_type", "int")
        if quant != "int":
            raise self.fail("only integer QMoE weights are supported", field="quant_type",
                            value=quant, remedy="quantise the experts to int (2, 4 or 8 bits), "
                                                "or run on ort-cpu / ort-cuda")
        base = int(self.attr("expert_weight_bits", 4))
        self.bits = {name: int(self.attr(f"{name}_expert_weight_bits", base))
                     for name in ("fc1", "fc2", "fc3")}
        for name, bits in self.bits.items():
            if bits not in (2, 4, 8):
                raise self.fail("expert weights of this width are not supported",
                                field=f"{name}_expert_weight_bits" if name != "fc1" or
                                bits != base else "expert_weight_bits", value=bits,
                                remedy="use 2, 4 or 8 bits (the 3-bit profile is not "
                                       "implemented)")
        self.block = int(self.attr("block_size", 0) or 0)
        if self.block and (self.block < 16 or self.block & (self.block - 1)):
            raise self.fail("block_size must be a power of two >= 16", field="block_size",
                            value=self.block, remedy="use 16, 32, 64, 128, ... or omit it")
        packed = int(self.attr("weights_prepacked", -1))
        if packed == 1:
            raise self.fail("prepacked expert weights are not supported",
                            field="weights_prepacked", value=packed,
                            remedy="export the raw layout (weights_prepacked=0)")
        for slot, name in self.REFUSED_INPUTS.items():
            if slot < len(self.node.input) and self.node.input[slot]:
                raise self.fail("this QMoE input is not supported", field=f"QMoE.input[{slot}]",
                                value=name, remedy="export integer experts without it")
        self._cached: dict[str, tuple] = {}

    def routing(self, be, logits, weights=None):
        """QMoE's CPU routing: the k largest logits, softmax over those k alone (so always
        normalised); with ``router_weights`` those weights instead, normalised if asked.
        Weights of 1e-8 or less drop out, as onnxruntime drops them."""
        xp = be.xp
        z = logits.astype(np.float32)
        chosen = self.chosen(be, z)
        if weights is None:
            mix = self.softmax(be, z, chosen)
        else:
            mix = xp.where(chosen, weights.astype(np.float32), np.float32(0))
            if self.normalize:
                total = be.sum(mix, 1, keepdims=True)
                mix = mix / xp.where(total == 0, np.float32(1), total)
        return xp.where(mix > np.float32(1e-8), mix, np.float32(0))

    def dequantised(self, be, name: str, q, scales, zero_points):
        """[E, N, K] float weights of one projection, kept while its inputs are the same."""
        cached = self._cached.get(name)
        inputs = (q, scales, zero_points)
        if cached is not None and all(a is b for a, b in zip(cached, inputs)):
            return cached[3]
        xp = be.xp
        bits = self.bits[name]
        experts, rows = q.shape[0], q.shape[1]
        width = q.shape[2] * 8 // bits
        dtype = np.dtype(np.float32) if scales.dtype.itemsize < 4 else scales.dtype
        values = unpack(xp, q, bits).astype(dtype)  # [E, N, K]
        block = self.block or width
        blocks = -(-width // block)
        if scales.size != experts * rows * blocks:
            raise self.fail(f"{name} scales do not hold one value per row and block",
                            field=f"{name}_scales.shape", value=tuple(scales.shape),
                            remedy=f"give {name}_scales {experts * rows * blocks} values "
                                   f"([{experts}, {rows}" + (f", {blocks}]" if self.block else "]"))
        scale = scales.reshape(experts, rows, blocks).astype(dtype)
        if zero_points is None:
            zp = dtype.type(1 << (bits - 1))
        elif not self.block:  # a zero point a row, packed along the rows: [E, ceil(N bits / 8)]
            zp = unpack(xp, zero_points.reshape(experts, -1), bits)[:, :rows]
            zp = zp.astype(dtype)[:, :, None]
        else:  # packed along each row's blocks: [E, N, ceil(blocks bits / 8)]
            zp = unpack(xp, zero_points.reshape(experts, rows, -1), bits)[:, :, :blocks]
            zp = xp.repeat(zp.astype(dtype), block, axis=2)[:, :, :width]
        scale = xp.repeat(scale, block, axis=2)[:, :, :width]
        weight = xp.ascontiguousarray((values - zp) * scale)
        self._cached[name] = (*inputs, weight)
        return weight

    def __call__(self, be, x, router, w1, s1=None, b1=None, w2=None, s2=None, b2=None,
                 w3=None, s3=None, b3=None, z1=None, z2=None, z3=None, router_weights=None,
                 *unused):
        if s1 is None or s2 is None or (w3 is not None and s3 is None):
            raise self.fail("integer QMoE needs the scales of every projection it has",
                            field="fc1_scales/fc2_scales/fc3_scales",
                            value=(s1 is None, s2 is None, w3 is not None and s3 is None),
                            remedy="wire each projection's scales")
        weights = (self.dequantised(be, "fc1", w1, s1, z1), b1,
                   self.dequantised(be, "fc2", w2, s2, z2), b2,
                   None if w3 is None else self.dequantised(be, "fc3", w3, s3, z3), b3)
        return (self.mix(be, x, router, weights, router_weights),)
