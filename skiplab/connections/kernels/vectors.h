/* A vector of REALs as wide as the machine's registers, with GCC's and Clang's vector extensions: 64 bytes where
   the kernel is built for AVX-512, 32 elsewhere (AVX2; on a machine with narrower registers the compiler splits
   each operation). Included by the kernels of this folder, each compiled with REAL = float and double. */
#ifndef SKIPLAB_VECTORS_H
#define SKIPLAB_VECTORS_H
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VBYTES 64
#else
#define VBYTES 32
#endif
typedef REAL vreal __attribute__((vector_size(VBYTES)));
#define VL ((int64_t)(VBYTES / sizeof(REAL)))

/* Loads and stores at any alignment. */
static inline vreal vload(const REAL *p) {
    vreal v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(REAL *p, vreal v) { memcpy(p, &v, sizeof v); }

/* The sum of a vector's lanes, pairwise: the upper half added to the lower until one lane is left (log2 VL
   dependent additions, not VL), down to 16 bytes as additions of vector halves (a 32- and a 16-byte vector type),
   not a loop over the lanes in memory. */
typedef REAL vreal32 __attribute__((vector_size(32)));
typedef REAL vreal16 __attribute__((vector_size(16)));

static inline REAL vsum(vreal v) {
    vreal32 x;
#if VBYTES == 64
    vreal32 hi;
    memcpy(&x, &v, 32);
    memcpy(&hi, (const char *)&v + 32, 32);
    x += hi;
#else
    memcpy(&x, &v, 32);
#endif
    vreal16 y, top;
    memcpy(&y, &x, 16);
    memcpy(&top, (const char *)&x + 16, 16);
    y += top;
    REAL lanes[16 / sizeof(REAL)];
    memcpy(lanes, &y, sizeof y);
    for (int64_t w = (int64_t)(16 / sizeof(REAL)) / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; l++) lanes[l] += lanes[l + w];
    return lanes[0];
}
#endif
