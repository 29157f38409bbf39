"""onnxruntime's BERT-era attention ops: com.microsoft MultiHeadAttention and Attention
(the op with its own Q/K/V projection), as onnxruntime's CPU kernels compute them.

Masking is additive and finite, as there: a key a padding mask or a key length hides gets
``mask_filter_value`` (-10000 unless set) added to its score, and a key the causal rule
hides (unidirectional: a query at position p sees keys 0..p, p counted after the past)
gets a fixed -10000 added on top, whatever ``mask_filter_value`` says (measured against
onnxruntime 1.32 with a filter of -3); a row that sees no key therefore still softmaxes its
scores, it never gives NaN. ``attention_bias`` is added after. The two products go through
``be.matmul`` (each row on its own, fixed order) and the softmax's sum through ``be.sum``,
so a row's bits do not depend on the batch. Packed QKV, buffer sharing, beam-search cache
indirection, rotary and the 2B / 3B+2 / 4-D mask forms are refused by name.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Kernel
from .nn import Softmax

DEFAULT_MASK_FILTER = -10000.0
CAUSAL_FILTER = -10000.0


def _heads(x, heads: int):
    """[B, S, N * H] -> [B, N, S, H]."""
    b, s, d = x.shape
    return x.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)


def _merge(y):
    """[B, N, S, H] -> [B, S, N * H]."""
    b, n, s, h = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * h)


class _ContribAttention(Kernel):
    domain = "com.microsoft"

    def setup(self) -> None:
        self.heads = int(self.attr("num_heads", 0))
        if self.heads <= 0:
            raise self.fail("num_heads must be positive", field="num_heads",
                            value=self.attr("num_heads"), remedy="set num_heads")
        self.scale = self.attr("scale")
        self.filter = float(self.attr("mask_filter_value", DEFAULT_MASK_FILTER))
        self.causal = bool(self.attr("unidirectional", 0))

    def refuse_inputs(self, slots: dict[int, str]) -> None:
        for slot, name in slots.items():
            if slot < len(self.node.input) and self.node.input[slot]:
                raise self.fail(f"this {self.node.op_type} input is not supported",
                                field=f"{self.node.op_type}.input[{slot}]", value=name,
                                remedy="export without it, or run on ort-cpu")

    def hidden_mask(self, xp, mask, batch: int, seq: int, total: int):
        """bool [B, 1, S, T] (or None): True where a padding mask or key length hides a key."""
        if mask is None:
            return None
        key = xp.arange(total).reshape(1, 1, 1, total)
        if mask.ndim == 1 and mask.shape[0] == batch:  # each row's key length
            return key >= mask.astype(np.int64).reshape(batch, 1, 1, 1)
        if mask.ndim == 2 and mask.shape == (batch, total):
            return (mask == 0).reshape(batch, 1, 1, total)
        if mask.ndim == 3 and mask.shape == (batch, seq, total):
            return (mask == 0).reshape(batch, 1, seq, total)
        raise self.fail("this mask form is not supported", field="mask.shape",
                        value=tuple(mask.shape),
                        remedy=f"give key lengths [{batch}], or a 0/1 mask [{batch}, {total}] "
                               f"or [{batch}, {seq}, {total}]")

    def attend(self, be, q, k, v, mask=None, bias=None):
        """q [B, N, S, H], k [B, N, T, H], v [B, N, T, Hv] (the past already in front):
        [B, N, S, Hv]."""
        xp = be.xp
        batch, _, seq, head = q.shape
        total = k.shape[2]
        compute = np.dtype(np.float32) if q.dtype.itemsize < 4 else q.dtype
        q, k, v = (t.astype(compute, copy=False) for t in (q, k, v))
        scale = 1 / math.sqrt(head) if self.scale is None else float(self.scale)
        scores = be.matmul(q, k.transpose(0, 1, 3, 2)) * compute.type(scale)
        masked = compute.type(self.filter)
        hidden = self.hidden_mask(xp, mask, batch, seq, total)
        if hidden is not None:
            scores = scores + xp.where(hidden, masked, compute.type(0))
        if self.causal:  # a fixed -10000 on top, whatever mask_filter_value says
            later = (xp.arange(total).reshape(1, total)
                     > xp.arange(seq).reshape(seq, 1) + (total - seq)).reshape(1, 1, seq, total)
            scores = scores + xp.where(later, compute.type(CAUSAL_FILTER), compute.type(0))
        if bias is not None:
            scores = scores + bias.astype(compute, copy=False)
        probs = Softmax.along(be, scores, 3)
        return be.matmul(probs, v)


class MultiHeadAttention(_ContribAttention):
    """query [B, S, D]; key and value [B, L, D] (projected here by the bias only) or, for
    cross attention, [B, N, L, H] already split by head; optional bias [D + D + Dv]
    (q, k, v); key_padding_mask (key lengths [B], or 0/1 [B, T] or [B, S, T]);
    attention_bias [B or 1, N or 1, S, T]; past_key/past_value [B, N, P, H] in front of the
    new keys, returned as present_key/present_value."""

    def setup(self) -> None:
        super().setup()
        self.refuse_inputs({8: "past_sequence_length", 9: "cache_indirection"})
        if len(self.node.output) > 3 and self.node.output[3]:
            raise self.fail("the qk output is not supported", field="MultiHeadAttention.output[3]",
                            value=self.node.output[3], remedy="export without qk")

    def __call__(self, be, query, key=None, value=None, bias=None, key_padding_mask=None,
                 attention_bias=None, past_key=None, past_value=None, *unused):
        xp = be.xp
        if query.ndim != 3 or key is None or value is None or key.ndim not in (3, 4):
            raise self.fail("packed QKV / KV forms are not supported", field="query/key.shape",
                            value=(tuple(query.shape), None if key is None else tuple(key.shape)),
                            remedy="give query [B, S, D] with key and value [B, L, D] or "
                                   "[B, N, L, H]")
        d = query.shape[2]
        q = query if bias is None else query + bias[:d]
        if key.ndim == 4:  # cross attention on keys and values already split by head
            if bias is not None and bias.shape[0] != d:
                raise self.fail("a bias for head-split keys is not supported", field="bias",
                                value=tuple(bias.shape),
                                remedy="add the key/value bias before splitting heads")
            k, v = key, value
        else:
            if bias is not None:
                dk = key.shape[2]
                key, value = key + bias[d:d + dk], value + bias[d + dk:]
            k, v = _heads(key, self.heads), _heads(value, self.heads)
        if past_key is not None:
            k = xp.concatenate([past_key, k], axis=2)
            v = xp.concatenate([past_value, v], axis=2)
        y = self.attend(be, _heads(q, self.heads), k, v, key_padding_mask, attention_bias)
        return (_merge(y).astype(query.dtype, copy=False), k, v)


class ContribAttention(_ContribAttention):
    """com.microsoft Attention: input [B, S, Din] projected by weights [Din, Dq + Dk + Dv]
    and bias (sizes from qkv_hidden_sizes, else three equal parts); mask_index (key lengths [B], or 0/1 [B, T]
    or [B, S, T]); past [2, B, N, P, H] in front of the new keys, returned as present
    [2, B, N, P + S, H]; attention_bias [B or 1, N or 1, S, T]."""

    op_type = "Attention"

    def setup(self) -> None:
        super().setup()
        sizes = self.attr("qkv_hidden_sizes")
        self.sizes = None if sizes is None else [int(v) for v in sizes]
        if int(self.attr("do_rotary", 0)):
            raise self.fail("rotary inside Attention is not supported", field="do_rotary",
                            value=1, remedy="export the rotation as its own op")
        if int(self.attr("past_present_share_buffer", 0)):
            raise self.fail("a shared past/present buffer is not supported",
                            field="past_present_share_buffer", value=1,
                            remedy="export with past_present_share_buffer=0")
        self.refuse_inputs({6: "past_sequence_length"})

    def __call__(self, be, x, weights, bias=None, mask_index=None, past=None,
                 attention_bias=None, *unused):
        xp = be.xp
        width = weights.shape[1]
        sizes = self.sizes or [width // 3] * 3
        if sum(sizes) != width or any(s % self.heads for s in sizes):
            raise self.fail("Q, K and V sizes must fill the weights and divide by num_heads",
                            field="qkv_hidden_sizes", value=(sizes, width),
                            remedy="set qkv_hidden_sizes to three multiples of num_heads "
                                   f"summing to {width}")
        qkv = be.matmul(x, weights)
        if bias is not None:
            qkv = qkv + bias
        q, k, v = (qkv[..., a:a + n] for a, n in zip((0, sizes[0], sizes[0] + sizes[1]), sizes))
        k, v = _heads(k, self.heads), _heads(v, self.heads)
        if past is not None:
            k = xp.concatenate([past[0], k], axis=2)
            v = xp.concatenate([past[1], v], axis=2)
        y = self.attend(be, _heads(q, self.heads), k, v, mask_index, attention_bias)
        y = _merge(y).astype(x.dtype, copy=False)
        if len(self.node.output) < 2 or not self.node.output[1]:
            return (y,)
        if k.shape != v.shape:
            raise self.fail("present stacks K and V, which differ in width here",
                            field="qkv_hidden_sizes", value=sizes,
                            remedy="give K and V one width, or drop the present output")
        return (y, xp.stack([k, v]))
