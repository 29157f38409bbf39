// Many device-to-device copies in one launch (batched_copy.py): the table of (dst, src,
// nbytes) travels as the launch's own argument, LK_COPY_ENTRIES copies at most.
#ifndef LK_COPY_ENTRIES
#error "LK_COPY_ENTRIES comes from the launcher (a -D option)"
#endif

// table.dst[e], table.src[e], table.nbytes[e]: copy e of `count`; blockIdx.y picks the copy.
struct alignas(16) lk_word16 { unsigned int w[4]; };
struct lk_copy_table {
    unsigned long long dst[LK_COPY_ENTRIES];
    unsigned long long src[LK_COPY_ENTRIES];
    unsigned long long nbytes[LK_COPY_ENTRIES];
};

__global__ void lk_copy_many(const lk_copy_table table, int count) {
    const int e = blockIdx.y;
    if (e >= count) return;
    unsigned char* dst = reinterpret_cast<unsigned char*>(table.dst[e]);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(table.src[e]);
    const unsigned long long nbytes = table.nbytes[e];
    const unsigned long long start = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long head = 0;  // bytes moved as 16-byte words
    if (((table.dst[e] | table.src[e]) & 15ull) == 0) {
        head = nbytes & ~15ull;
        const lk_word16* s = reinterpret_cast<const lk_word16*>(src);
        lk_word16* d = reinterpret_cast<lk_word16*>(dst);
        for (unsigned long long i = start; i < head / 16; i += stride) d[i] = s[i];
    }
    for (unsigned long long i = head + start; i < nbytes; i += stride) dst[i] = src[i];
}
