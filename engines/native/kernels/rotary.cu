// Rotary embeddings (the Rotary, Rotary2 and RotaryKVWrite nodes): rotary, rotary2 and
// rotary_kv, one instance per (x's type TX, cos/sin's type TC, the output's type TO).
#include "rotary.cuh"

// One thread per output element.
template <typename TX, typename TC, typename TO>
__global__ void rotary(
        const TX* __restrict__ x, const TC* __restrict__ cosv, const TC* __restrict__ sinv,
        TO* __restrict__ out, long long total, long long H, long long M, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    lk_rotary<TX, TC, TO>(x, cosv, sinv, out, idx, H, M, D, xb, xh, xm, xd, cb, ch, cm,
                          cd, sb, sh, sm, sd, pairs, has_scale, scale);
}

// Two rotations over the same cos/sin rows (a layer's queries and keys) in one launch:
// threads [0, total_a) rotate a, the rest b; each with its own heads, strides and scale.
template <typename TX, typename TC, typename TO>
__global__ void rotary2(
        const TX* __restrict__ xa, TO* __restrict__ out_a, long long total_a, long long Ha,
        long long ab, long long ah, long long am, long long ad, int scaled_a, float scale_a,
        const TX* __restrict__ xb, TO* __restrict__ out_b, long long total_b, long long Hb,
        long long bb, long long bh, long long bm, long long bd, int scaled_b, float scale_b,
        const TC* __restrict__ cosv, const TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total_a) {
        lk_rotary<TX, TC, TO>(xa, cosv, sinv, out_a, idx, Ha, M, D, ab, ah, am, ad, cb,
                              ch, cm, cd, sb, sh, sm, sd, pairs, scaled_a, scale_a);
    } else if (idx - total_a < total_b) {
        lk_rotary<TX, TC, TO>(xb, cosv, sinv, out_b, idx - total_a, Hb, M, D, bb, bh, bm,
                              bd, cb, ch, cm, cd, sb, sh, sm, sd, pairs, scaled_b,
                              scale_b);
    }
}

// A layer's rotation of queries and keys and its static-cache write in one launch: threads
// [0, total_q) rotate xq into out_q as rotary2 does (lk_rotary); the rest write the caches
// (lk_rotary_kv_store). Every element is the bits of rotary2 then kv_write2; one launch where
// there were two.
template <typename TX, typename TC, typename TO>
__global__ void rotary_kv(
        const TX* __restrict__ xq, TO* __restrict__ out_q, long long total_q, long long Hq,
        long long qb, long long qh, long long qm, long long qd, int scaled_q, float scale_q,
        const TX* __restrict__ xk, long long Hk, long long kb, long long kh, long long km,
        long long kd, int scaled_k, float scale_k,
        const TC* __restrict__ cosv, const TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs,
        const TO* __restrict__ old_k, TO* __restrict__ cache_k, long long runs_k,
        const TO* __restrict__ old_v, const TO* __restrict__ new_v, TO* __restrict__ cache_v,
        long long runs_v, long long Hv, long long vb, long long vh, long long vm,
        const long long* __restrict__ pos, long long C) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total_q) {
        lk_rotary<TX, TC, TO>(xq, cosv, sinv, out_q, idx, Hq, M, D, qb, qh, qm, qd, cb,
                              ch, cm, cd, sb, sh, sm, sd, pairs, scaled_q, scale_q);
        return;
    }
    lk_rotary_kv_store<TX, TC, TO>(idx - total_q, xk, Hk, kb, kh, km, kd, scaled_k,
                                   scale_k, cosv, sinv, M, D, cb, ch, cm, cd, sb, sh, sm,
                                   sd, pairs, old_k, cache_k, runs_k, old_v, new_v,
                                   cache_v, runs_v, Hv, vb, vh, vm, pos, C);
}
