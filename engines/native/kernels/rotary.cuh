// A rotary embedding's element (x * cos + rotate(x) * sin, computed in TC), and the key
// cache's write of a rotated row: rotary.cu's kernels and rotary_kv_attention run them.
#pragma once
#include "kv_write.cuh"
#include "round.cuh"

// One output element of [B, H, M, D] (C order). x is read through its strides (a
// transposed view is fine) as TX and computed in TC (cos/sin's type: the folded Cast
// up); a channel's partner is d +- D/2 (halves) or d ^ 1 (pairs), negated when first.
// The value lk_rotary stores at (b, h, m, d) (computed in TC, not yet rounded to TO).
template <typename TX, typename TC>
__device__ __forceinline__ float lk_rotary_at(
        const TX* __restrict__ x, const TC* __restrict__ cosv, const TC* __restrict__ sinv,
        long long b, long long h, long long m, long long d, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    const TC* C = 0;
    const long long half = D / 2;
    long long partner;
    bool negate;
    if (pairs) { partner = d ^ 1; negate = (d & 1) == 0; }
    else if (d < half) { partner = d + half; negate = true; }
    else { partner = d - half; negate = false; }
    const long long row = b * xb + h * xh + m * xm;
    const float xv = lk_round(C, lk_load(x, row + d * xd));
    float rv = lk_round(C, lk_load(x, row + partner * xd));
    if (negate) rv = -rv;
    const float c = lk_load(cosv, b * cb + h * ch + m * cm + d * cd);
    const float s = lk_load(sinv, b * sb + h * sh + m * sm + d * sd);
    float y = lk_round(C, lk_round(C, xv * c) + lk_round(C, rv * s));
    if (has_scale) y = lk_round(C, y * scale);
    return y;
}

// The same at the C-order index idx of [B, H, M, D].
template <typename TX, typename TC>
__device__ __forceinline__ float lk_rotary_val(
        const TX* __restrict__ x, const TC* __restrict__ cosv, const TC* __restrict__ sinv,
        long long idx, long long H, long long M, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    const long long d = idx % D;
    long long t = idx / D;
    const long long m = t % M;
    t /= M;
    const long long h = t % H;
    return lk_rotary_at<TX, TC>(x, cosv, sinv, t / H, h, m, d, D, xb, xh, xm, xd, cb,
                                ch, cm, cd, sb, sh, sm, sd, pairs, has_scale, scale);
}

template <typename TX, typename TC, typename TO>
__device__ __forceinline__ void lk_rotary(
        const TX* __restrict__ x, const TC* __restrict__ cosv, const TC* __restrict__ sinv,
        TO* __restrict__ out, long long idx, long long H, long long M, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    lk_store(out, idx, lk_rotary_val<TX, TC>(x, cosv, sinv, idx, H, M, D, xb, xh, xm,
                                             xd, cb, ch, cm, cd, sb, sh, sm, sd,
                                             pairs, has_scale, scale));
}

// Run v of the two static caches a layer's write fills (runs [0, runs_k) the key cache, the
// next runs_v the value cache): as kv_write2v writes them, a written key slot taking the key
// row rotated in place (lk_rotary_at at that row, rounded to TO as the rotated keys were
// stored, then + 0 as the write stores it). rotary_kv and rotary_kv_attention both run it.
template <typename TX, typename TC, typename TO>
__device__ __forceinline__ void lk_rotary_kv_store(
        long long v, const TX* __restrict__ xk, long long Hk, long long kb, long long kh,
        long long km, long long kd, int scaled_k, float scale_k,
        const TC* __restrict__ cosv, const TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs,
        const TO* __restrict__ old_k, TO* __restrict__ cache_k, long long runs_k,
        const TO* __restrict__ old_v, const TO* __restrict__ new_v, TO* __restrict__ cache_v,
        long long runs_v, long long Hv, long long vb, long long vh, long long vm,
        const long long* __restrict__ pos, long long C) {
    if (v >= runs_k) {
        if (v - runs_k < runs_v) {
            lk_kv_write_vec<TO>(old_v, new_v, pos, cache_v, v - runs_k, Hv, C, D, M, vb, vh,
                                vm);
        }
        return;
    }
    constexpr int V = 16 / sizeof(TO);
    const TO* O = 0;
    const long long e0 = v * V;
    long long b, h, d;
    const long long hit = lk_cache_slot(e0, Hk, C, D, pos, M, &b, &h, &d);
    if (hit < 0) {
        reinterpret_cast<lk_vec16*>(cache_k)[v] = reinterpret_cast<const lk_vec16*>(old_k)[v];
        return;
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {  // the rotated key row `hit`, channel d + e
        const float y = lk_rotary_at<TX, TC>(xk, cosv, sinv, b, h, hit, d + e, D, kb,
                                             kh, km, kd, cb, ch, cm, cd, sb, sh, sm,
                                             sd, pairs, scaled_k, scale_k);
        lk_store(cache_k, e0 + e, lk_round(O, y) + 0.0f);
    }
}
