"""Scaled dot-product attention: ONNX Attention (23/24/25) and onnxruntime's com.microsoft
GroupQueryAttention (the op onnxruntime-genai's model builder writes, kv cache included).

Both are written once over [B, heads, S, H] arrays: the two products go through
``be.matmul`` (each row on its own, fixed order), the softmax sums through ``be.sum``; a
query head g reads kv head g // (heads / kv_heads), done by folding the group into the
product's rows rather than repeating the cache. Masks are built on the backend from index
ranges and the (device) sequence lengths; only shapes are read on the host.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from .base import Kernel, host_ints
from .nn import softmax_sum
from .rotary import rotate


def grouped_scores(be, q, k):
    """q [B, N, S, H] @ k^T for k [B, Nk, L, H], N a multiple of Nk: scores [B, N, S, L]."""
    b, n, s, h = q.shape
    nk, length = k.shape[1], k.shape[2]
    qg = q.reshape(b, nk, (n // nk) * s, h)
    return be.matmul(qg, k.transpose(0, 1, 3, 2)).reshape(b, n, s, length)


def grouped_values(be, probs, v):
    """probs [B, N, S, L] @ v [B, Nk, L, Hv]: [B, N, S, Hv]."""
    b, n, s, length = probs.shape
    nk = v.shape[1]
    pg = probs.reshape(b, nk, (n // nk) * s, length)
    return be.matmul(pg, v).reshape(b, n, s, v.shape[3])


def masked_softmax(be, x, allowed=None):
    """Softmax over the last axis with ``allowed`` (broadcastable bool) as the keys a row may
    see; a row that sees nothing (all -inf) gives zeros, never NaN."""
    xp = be.xp
    if allowed is not None:
        x = xp.where(allowed, x, x.dtype.type(-np.inf))
    top = xp.max(x, axis=-1, keepdims=True)
    top = xp.where(top == x.dtype.type(-np.inf), x.dtype.type(0), top)
    e = xp.exp(x - top)
    total = row_sum(be, e)
    total = xp.where(total == 0, x.dtype.type(1), total)
    return e / total


def row_sum(be, e):
    """Sum over the last axis, kept (``nn.softmax_sum``: bfloat16 adds in bfloat16)."""
    return softmax_sum(be, e, e.ndim - 1)


def softcapped(xp, x, cap: float):
    c = x.dtype.type(cap)
    return c * xp.tanh(x / c)


class Attention(Kernel):
    """ONNX Attention: 3-D inputs [B, S, heads*H] (q_num_heads, kv_num_heads) or 4-D
    [B, heads, S, H]; past_key/past_value are concatenated in front (present_key/value are
    the results); attn_mask is bool (True attends) or additive, shorter masks are padded
    with masked keys; is_causal aligns the diagonal to the end of the cache; softcap before
    the mask; fully masked rows give zeros. qk_matmul_output_mode picks output 3: 0/1 the
    (soft-capped) scaled products, 2 with the mask added, 3 the probabilities."""

    def setup(self) -> None:
        self.is_causal = bool(self.attr("is_causal", 0))
        self.q_heads = self.attr("q_num_heads")
        self.kv_heads = self.attr("kv_num_heads")
        self.scale = self.attr("scale")
        self.softcap = float(self.attr("softcap", 0.0))
        self.mode = int(self.attr("qk_matmul_output_mode", 0))
        precision = self.attr("softmax_precision")
        self.softmax_dtype = (None if precision is None
                              else np.dtype(helper.tensor_dtype_to_np_dtype(precision)))
        self.left = int(self.attr("left_window_size", -1))
        self.right = int(self.attr("right_window_size", -1))

    def heads_first(self, x, heads, what: str):
        if x.ndim == 4:
            return x
        if heads is None or x.shape[2] % int(heads):
            raise self.fail(f"3-D {what} needs a head count dividing its hidden size",
                            field="q_num_heads" if what == "Q" else "kv_num_heads",
                            value=heads, remedy=f"set it to a divisor of {x.shape[2]}")
        heads = int(heads)
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads).transpose(0, 2, 1, 3)

    def __call__(self, be, q, k, v, attn_mask=None, past_key=None, past_value=None,
                  nonpad_kv_seqlen=None):
        xp = be.xp
        three_d = q.ndim == 3
        q = self.heads_first(q, self.q_heads, "Q")
        k = self.heads_first(k, self.kv_heads, "K")
        v = self.heads_first(v, self.kv_heads, "V")
        dtype = q.dtype
        if q.shape[1] % k.shape[1]:
            raise self.fail("query heads are not a multiple of kv heads", field="Q.shape",
                            value=(tuple(q.shape), tuple(k.shape)),
                            remedy="use a kv head count that divides the query heads")
        scale = 1 / math.sqrt(q.shape[3]) if self.scale is None else float(self.scale)
        root = dtype.type(math.sqrt(scale))  # applied to Q and K alike, as ONNX specifies
        if past_key is not None:
            k = xp.concatenate([past_key, k], axis=2)
            v = xp.concatenate([past_value, v], axis=2)
        present_k, present_v = k, v
        q_len, kv_len = q.shape[2], k.shape[2]

        bias = self.bias(xp, attn_mask, past_key, nonpad_kv_seqlen, q_len, kv_len, dtype)
        qk = grouped_scores(be, q * root, k * root)
        if self.softcap > 0:
            qk = softcapped(xp, qk, self.softcap)
        with_bias = qk + bias
        exposed = with_bias if self.mode == 2 else qk
        logits = with_bias if self.softmax_dtype is None else with_bias.astype(self.softmax_dtype)
        probs = masked_softmax(be, logits)
        # A row whose bias masks every key attends nothing, whatever its scores.
        dead = xp.max(bias, axis=-1, keepdims=True) == bias.dtype.type(-np.inf)
        probs = xp.where(dead, probs.dtype.type(0), probs)
        if self.mode == 3:
            exposed = probs
        y = grouped_values(be, probs.astype(dtype, copy=False), v)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], q_len, -1)
        return (y, present_k, present_v, exposed.astype(dtype, copy=False))

    def bias(self, xp, mask, past_key, nonpad, q_len: int, kv_len: int, dtype):
        """The additive mask [.., q_len, kv_len]: 0 where a key may be seen, -inf elsewhere."""
        zero, ninf = dtype.type(0), dtype.type(-np.inf)
        if mask is not None:
            if mask.shape[-1] < kv_len:  # keys past the mask's end are masked
                pad = mask.shape[:-1] + (kv_len - mask.shape[-1],)
                fill = False if mask.dtype == np.bool_ else ninf
                mask = xp.concatenate([mask, xp.full(pad, fill, dtype=mask.dtype)], axis=-1)
            if mask.dtype == np.bool_:
                mask = xp.where(mask, zero, ninf)
            mask = mask.astype(dtype, copy=False)
        bias = xp.zeros((q_len, kv_len), dtype=dtype)
        if mask is not None:
            bias = bias + mask
        i = xp.arange(q_len).reshape(q_len, 1)
        j = xp.arange(kv_len).reshape(1, kv_len)
        if past_key is None and nonpad is not None:
            # per batch: the query block ends at the last valid key
            offset = (nonpad.astype(np.int64) - q_len).reshape(-1, 1, 1, 1)
        else:
            offset = past_key.shape[2] if past_key is not None else 0
        diff = i + offset - j  # query position minus key position
        if self.is_causal:
            bias = bias + xp.where(diff >= 0, zero, ninf)
        if self.left >= 0:
            bias = bias + xp.where(diff <= self.left, zero, ninf)
        if self.right >= 0:
            bias = bias + xp.where(-diff <= self.right, zero, ninf)
        if nonpad is not None:
            valid = xp.arange(kv_len).reshape(1, kv_len) < nonpad.reshape(-1, 1)
            bias = bias + xp.where(valid, zero, ninf).reshape(-1, 1, 1, kv_len)
        return bias


class GroupQueryAttention(Kernel):
    """com.microsoft GroupQueryAttention, causal, with its kv cache (onnxruntime's CPU
    semantics): query [B, S, N*H] with key/value [B, S, Nk*H], or packed QKV in query;
    past_key/past_value [B, Nk, P, H]; seqlens_k [B] is each row's total length minus one
    (a device value); total_sequence_length (host) sets the present length max(T, P).
    A first prompt (S == T) writes its keys from 0; otherwise row b's S new keys go to
    [seqlens_k[b] + 1 - S, seqlens_k[b] + 1), the past is kept before them and the rest of
    present is zero. do_rotary rotates Q and K at those positions from cos/sin caches, or at
    ``position_ids`` [B, S] where given (a first prompt reads only its first element, the
    start of every row's run, as onnxruntime 1.32's CPU kernel does); local_window_size w > 0 lets a query see w keys, itself and the w - 1 before it (as
    onnxruntime 1.32's CPU kernel does); softcap and smooth_softmax as onnxruntime defines
    them."""

    domain = "com.microsoft"
    host_inputs = frozenset({6})
    # inputs 10.. (attention_bias, head_sink, kv quantisation scales, q/k norms,
    # query_seqlens): not implemented, refused by name when wired
    UNSUPPORTED_INPUTS = ("attention_bias", "head_sink", "k_scale", "v_scale",
                          "q_norm_weight", "k_norm_weight", "query_seqlens")

    def setup(self) -> None:
        self.heads = int(self.attr("num_heads", 0))
        self.kv_heads = int(self.attr("kv_num_heads", 0))
        if self.heads <= 0 or self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise self.fail("num_heads must be a positive multiple of kv_num_heads",
                            field="num_heads", value=(self.heads, self.kv_heads),
                            remedy="set num_heads and kv_num_heads (num_heads % kv_num_heads == 0)")
        self.scale = float(self.attr("scale", 0.0))
        self.softcap = float(self.attr("softcap", 0.0))
        self.window = int(self.attr("local_window_size", -1))
        self.do_rotary = bool(self.attr("do_rotary", 0))
        self.interleaved = bool(self.attr("rotary_interleaved", 0))
        self.smooth = int(self.attr("smooth_softmax", -1)) == 1
        for slot, name in enumerate(self.UNSUPPORTED_INPUTS, start=10):
            if slot < len(self.node.input) and self.node.input[slot]:
                raise self.fail("this GroupQueryAttention input is not supported",
                                field=f"GroupQueryAttention.input[{slot}]", value=name,
                                remedy="export without it, or run on ort-cpu")
        if len(self.node.output) > 3 and self.node.output[3]:
            raise self.fail("output_qk is not supported", field="GroupQueryAttention.output[3]",
                            value=self.node.output[3], remedy="export without qk_output")
        if int(self.attr("causal", 1)) != 1:
            raise self.fail("only causal GroupQueryAttention is supported", field="causal",
                            value=self.attr("causal"), remedy="export with causal=1")
        kv_type = self.attr("k_quant_type", "NONE")
        if str(kv_type).upper() != "NONE" or int(self.attr("kv_cache_bit_width", 0) or 0):
            raise self.fail("a quantised kv cache is not supported", field="k_quant_type",
                            value=kv_type, remedy="export with an unquantised cache")

    def split(self, query, key, value):
        """Q [B, N, S, H] and K, V [B, Nk, S, H] (packed QKV split by head counts)."""
        b, s, d = query.shape
        n, nk = self.heads, self.kv_heads
        if key is None:
            h = d // (n + 2 * nk)
            if h * (n + 2 * nk) != d:
                raise self.fail("packed QKV width is not (num_heads + 2 kv_num_heads) * H",
                                field="query.shape", value=tuple(query.shape),
                                remedy="check num_heads and kv_num_heads")
            q, key, value = (query[..., : n * h], query[..., n * h: (n + nk) * h],
                             query[..., (n + nk) * h:])
        else:
            h = d // n
            q = query
        if key.shape[-1] != nk * h or value.shape[-1] != nk * h:
            raise self.fail("key/value width is not kv_num_heads * head_size",
                            field="key.shape", value=(tuple(key.shape), tuple(value.shape)),
                            remedy=f"give key and value {nk * h} channels")

        def heads(x, count):
            return x.reshape(b, s, count, h)
        return heads(q, n), heads(key, nk), heads(value, nk)

    def __call__(self, be, query, key=None, value=None, past_key=None, past_value=None,
                 seqlens_k=None, total_sequence_length=None, cos_cache=None, sin_cache=None,
                 position_ids=None, *unused):
        xp = be.xp
        if seqlens_k is None or total_sequence_length is None:
            raise self.fail("seqlens_k and total_sequence_length are required",
                            field="GroupQueryAttention.input[5:7]",
                            value=(seqlens_k is None, total_sequence_length is None),
                            remedy="wire both inputs")
        (total,) = host_ints(total_sequence_length)
        q, k, v = self.split(query, key, value)  # [B, S, heads, H]
        batch, seq, _, h = q.shape
        past_len = 0 if past_key is None else past_key.shape[2]
        present_len = max(total, past_len)
        first_prompt = seq == total  # otherwise the new tokens follow each row's past
        lengths = seqlens_k.astype(np.int64) + 1  # [B] valid keys per row after this step
        start = xp.zeros_like(lengths) if first_prompt else lengths - seq
        positions = start.reshape(batch, 1) + xp.arange(seq, dtype=np.int64).reshape(1, seq)
        if self.do_rotary:
            if cos_cache is None or sin_cache is None:
                raise self.fail("do_rotary needs cos_cache and sin_cache",
                                field="GroupQueryAttention.input[7:9]", value=None,
                                remedy="wire both caches or set do_rotary=0")
            at = positions
            if position_ids is not None:
                at = position_ids.astype(np.int64, copy=False)
                if first_prompt:  # one start for every row, from the first element
                    at = at[:1, :1] + xp.arange(seq, dtype=np.int64).reshape(1, seq)
                at = xp.broadcast_to(at, (batch, seq))
            cos = xp.take(cos_cache, at, axis=0)
            sin = xp.take(sin_cache, at, axis=0)
            dim = 2 * cos_cache.shape[-1]
            q = rotate(xp, q, cos, sin, dim, self.interleaved)
            k = rotate(xp, k, cos, sin, dim, self.interleaved)
        q = q.transpose(0, 2, 1, 3)
        present_k = self.present(xp, past_key, k.transpose(0, 2, 1, 3), start, present_len)
        present_v = self.present(xp, past_value, v.transpose(0, 2, 1, 3), start, present_len)

        alpha = self.scale or 1 / math.sqrt(h)
        scores = grouped_scores(be, q, present_k) * q.dtype.type(alpha)
        if self.softcap > 0:
            scores = softcapped(xp, scores, self.softcap)
        key_at = xp.arange(present_len, dtype=np.int64).reshape(1, 1, 1, present_len)
        query_at = positions.reshape(batch, 1, seq, 1)
        allowed = (key_at <= query_at) & (key_at < lengths.reshape(batch, 1, 1, 1))
        if self.window > 0:
            allowed &= key_at > query_at - self.window
        probs = self.softmax(be, scores, allowed)
        y = grouped_values(be, probs.astype(q.dtype, copy=False), present_v)  # [B, N, S, H]
        y = y.transpose(0, 2, 1, 3).reshape(batch, seq, self.heads * h)
        return (y, present_k, present_v)

    def softmax(self, be, scores, allowed):
        if not self.smooth:
            return masked_softmax(be, scores, allowed)
        # smooth softmax: one more logit fixed at 0 joins the denominator
        xp = be.xp
        x = xp.where(allowed, scores, scores.dtype.type(-np.inf))
        top = xp.maximum(xp.max(x, axis=-1, keepdims=True), scores.dtype.type(0))
        e = xp.exp(x - top)
        return e / (row_sum(be, e) + xp.exp(-top))

    def present(self, xp, past, new, start, length: int):
        """[B, Nk, length, H]: past before each row's start, the new S keys from it, zeros
        after (built with index arithmetic on the backend: start is a device value)."""
        batch, heads, seq, h = new.shape
        t = xp.arange(length, dtype=np.int64).reshape(1, 1, length, 1)
        begin = start.reshape(batch, 1, 1, 1)
        offset = t - begin
        is_new = (offset >= 0) & (offset < seq)
        index = xp.broadcast_to(xp.clip(offset, 0, seq - 1), (batch, heads, length, h))
        out = xp.where(is_new, xp.take_along_axis(new, index, axis=2), new.dtype.type(0))
        if past is None:
            return out
        keep = past
        if past.shape[2] < length:
            pad = xp.zeros((batch, heads, length - past.shape[2], h), dtype=past.dtype)
            keep = xp.concatenate([past, pad], axis=2)
        return xp.where(t < begin, keep.astype(new.dtype, copy=False), out)
