/* Sinkhorn-Knopp over many small matrices, the positions in the vector lanes (sinkhorn.py says why).

   For each position's m0 = exp(l - max l) (n x n; the exponential is the caller's, PyTorch's vectorised one):
   `iters` times the columns and then the rows normalised to sum 1, each half-step y = m / s with s = m.sum over
   the rows (columns' sums) or over the columns (rows' sums), summed in index order, as the eager form
   (skiplab.connections.hyper._Sinkhorn) does, the division as a product with 1/s (n divisions a half-step, not
   n^2: within an ulp of the quotient each time). Where a sum is 0 or subnormal its reciprocal overflows (inf, and
   0 * inf = NaN where the quotient is 0): every 1/s of a group is checked (1/s - 1/s is 0 unless 1/s is not finite)
   and a group with one that is not is computed again with the divisions themselves, as the eager form does (so the
   kernel gives NaN where it does: a column whose every entry underflowed). Backward, the unrolled iterations' vector-Jacobian products, last
   half-step first, give dm0 (the caller's exponential's backward makes dl = dm0 * m0):

       g <- (g - sum_k(g * y)) / s

   VL positions run at a time, one a lane: a group's n*n entries are n*n vectors, so every sum and division is a
   vector operation across positions and the whole iteration stays in registers (the eager form makes two
   operators a half-step, 80 a call forward). The backward recomputes the forward from m0, keeping the half-steps'
   y and s in a per-thread buffer (a group's, in cache), so nothing is saved between the passes but m0.
   Compiled twice, with REAL = float and double (NAME appends _f32 / _f64). Threads split the groups. */
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>

#include "vectors.h"

#define MAX_N 8 /* the largest n a call may have: sinkhorn.py checks it */
#define ALWAYS static inline __attribute__((always_inline))

/* The group's logits, entry e of lane l from position p0 + l (a short last group repeats its first position). */
static void gather(const REAL *src, int64_t p0, int64_t count, int64_t nn, vreal *m) {
    REAL lane[VL];
    for (int64_t e = 0; e < nn; e++) {
        for (int64_t l = 0; l < VL; l++) lane[l] = src[(p0 + (l < count ? l : 0)) * nn + e];
        m[e] = vload(lane);
    }
}

static void scatter(const vreal *m, int64_t p0, int64_t count, int64_t nn, REAL *dst) {
    REAL lane[VL];
    for (int64_t e = 0; e < nn; e++) {
        vstore(lane, m[e]);
        for (int64_t l = 0; l < count; l++) dst[(p0 + l) * nn + e] = lane[l];
    }
}

/* One half-step in place: k = 0 divides each column by its sum over the rows, k = 1 each row by its sum over the
   columns; the n sums into s. divide = 0: each entry times 1/s, and 1/s - 1/s added into *bad (NaN where 1/s
   overflowed); divide = 1: each entry divided by s. */
ALWAYS void half_step(vreal *m, vreal *s, int k, const int n, const int divide, vreal *bad) {
    for (int a = 0; a < n; a++) { /* a: the column (k = 0) or the row (k = 1) */
        const int stride = k ? 1 : n, first = k ? a * n : a;
        vreal sum = m[first];
        for (int b = 1; b < n; b++) sum += m[first + b * stride];
        s[a] = sum;
        if (divide) {
            for (int b = 0; b < n; b++) m[first + b * stride] /= sum;
        } else {
            const vreal inv = 1 / sum; /* one division a sum, not one an entry: division is the slow operation */
            *bad += inv - inv;
            for (int b = 0; b < n; b++) m[first + b * stride] *= inv;
        }
    }
}

/* Whether a check sum of half_step holds a NaN (a reciprocal that overflowed). */
static inline int overflowed(vreal bad) { return vsum(bad) != 0; }

/* The vector-Jacobian product of a half-step: g <- (g - sum_k(g * y)) / s (divide: by s itself, else times 1/s).
   */
ALWAYS void half_step_back(vreal *g, const vreal *y, const vreal *s, int k, const int n, const int divide) {
    for (int a = 0; a < n; a++) {
        const int stride = k ? 1 : n, first = k ? a * n : a;
        vreal dot = g[first] * y[first];
        for (int b = 1; b < n; b++) dot += g[first + b * stride] * y[first + b * stride];
        if (divide) {
            for (int b = 0; b < n; b++) g[first + b * stride] = (g[first + b * stride] - dot) / s[a];
        } else {
            const vreal inv = 1 / s[a];
            for (int b = 0; b < n; b++) g[first + b * stride] = (g[first + b * stride] - dot) * inv;
        }
    }
}

/* The group's iterations; 1 where a reciprocal overflowed (nothing written: the caller divides instead). */
ALWAYS int iterate_group(const REAL *m0, int64_t p0, int64_t count, int64_t iters, REAL *out, const int n,
                         const int divide) {
    vreal m[MAX_N * MAX_N], s[MAX_N], bad = {0};
    gather(m0, p0, count, n * n, m);
    for (int64_t t = 0; t < iters; t++) {
        half_step(m, s, 0, n, divide, &bad);
        half_step(m, s, 1, n, divide, &bad);
    }
    if (!divide && overflowed(bad)) return 1;
    scatter(m, p0, count, n * n, out);
    return 0;
}

ALWAYS void forward_group(const REAL *m0, int64_t p0, int64_t count, int64_t iters, REAL *out, const int n) {
    if (iterate_group(m0, p0, count, iters, out, n, 0)) iterate_group(m0, p0, count, iters, out, n, 1);
}

/* ys: (2 iters + 1) n*n vectors (m0 and each half-step's y), ss: 2 iters * n vectors. */
ALWAYS void backward_pass(const REAL *m0, const REAL *grad, int64_t p0, int64_t count, int64_t iters,
                          REAL *dm0, vreal *ys, vreal *ss, const int n, const int divide, vreal *bad) {
    const int nn = n * n;
    gather(m0, p0, count, nn, ys);
    for (int64_t h = 0; h < 2 * iters; h++) {
        vreal *y = ys + (h + 1) * nn;
        for (int e = 0; e < nn; e++) y[e] = ys[h * nn + e];
        half_step(y, ss + h * n, (int)(h % 2), n, divide, bad);
    }
    if (!divide && overflowed(*bad)) return;
    vreal g[MAX_N * MAX_N];
    gather(grad, p0, count, nn, g);
    for (int64_t h = 2 * iters - 1; h >= 0; h--)
        half_step_back(g, ys + (h + 1) * nn, ss + h * n, (int)(h % 2), n, divide);
    scatter(g, p0, count, nn, dm0);
}

ALWAYS void backward_group(const REAL *m0, const REAL *grad, int64_t p0, int64_t count, int64_t iters,
                           REAL *dm0, vreal *ys, vreal *ss, const int n) {
    vreal bad = {0};
    backward_pass(m0, grad, p0, count, iters, dm0, ys, ss, n, 0, &bad);
    if (overflowed(bad)) backward_pass(m0, grad, p0, count, iters, dm0, ys, ss, n, 1, &bad);
}

#define GROUPS(p) (((p) + VL - 1) / VL)

/* out (P, n, n) from m0 (P, n, n). Returns 0; 2 for n outside 1..MAX_N or iters < 0. */
int NAME(forward)(const REAL *m0, int64_t p, int64_t n, int64_t iters, REAL *out, int threads) {
    if (n < 1 || n > MAX_N || iters < 0) return 2;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t gi = 0; gi < GROUPS(p); gi++) {
        const int64_t p0 = gi * VL, count = p - p0 < VL ? p - p0 : VL;
        if (n == 4)
            forward_group(m0, p0, count, iters, out, 4);
        else
            forward_group(m0, p0, count, iters, out, (int)n);
    }
    return 0;
}

/* dm0 (P, n, n) from grad (P, n, n), the forward recomputed from m0. Returns 0; 1 when memory could not be had; 2
   as forward. */
int NAME(backward)(const REAL *m0, const REAL *grad, int64_t p, int64_t n, int64_t iters, REAL *dm0, int threads) {
    if (n < 1 || n > MAX_N || iters < 0) return 2;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(| : failed)
#endif
    {
        vreal *ys = aligned_alloc(64, sizeof(vreal) * (size_t)((2 * iters + 1) * n * n + 2 * iters * n + 1));
        if (!ys) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t gi = 0; gi < GROUPS(p); gi++) {
            if (!ys) continue;
            vreal *ss = ys + (2 * iters + 1) * n * n;
            const int64_t p0 = gi * VL, count = p - p0 < VL ? p - p0 : VL;
            if (n == 4)
                backward_group(m0, grad, p0, count, iters, dm0, ys, ss, 4);
            else
                backward_group(m0, grad, p0, count, iters, dm0, ys, ss, (int)n);
        }
        free(ys);
    }
    return failed;
}
