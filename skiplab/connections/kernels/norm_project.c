/* The streams' norm and projection of dynamic hyper-connections, row by row (norm_project.py says why).

   x (R, F) rows, V (K, F) the projection's rows, vsum (K) = V 1. With mu the row's mean (centre: LayerNorm's;
   otherwise 0) and r = (var + eps)^(-1/2), var the row's variance (centre) or mean square:

       t_j = r (<x, V_j> - mu vsum_j)                                       (R, K)

   Backward, with g the gradient at t, gu = r g, alpha = -r^2 <g, t> / F and, where centre,
   beta = (-<gu, vsum> - alpha mu F) / F (else beta = 0):

       dx = [dx +] sum_j gu_j V_j + alpha x + beta,    dV_j += gu_j (x - mu)

   and, where the read h0 = sum_i a_i x_i of the same streams left it (read_term), its part a_i dh0 added to dx too.

   Rows go in blocks of RB: the forward's K dot products of a block are made tile by tile of CT columns, so the
   block's tile and V's tile stay in the first-level cache; the backward makes dx and dV of a block in one pass over
   its columns, the block's RB partial rows of dx in registers, so each of x, dx (and V, dV from the second-level
   cache) is read once a block. The row statistics are sums about the row's first value (in REAL within a tile, in double across
   tiles), as accurate as the eager formula's where the mean dwarfs the spread. Threads (PyTorch's OpenMP threads,
   as in add_group_norm.c) split the blocks; each adds dV into its own slice of `dv_parts` (threads, K, F),
   which the caller sums in thread order. Compiled twice, with REAL = float and double (NAME appends _f32 / _f64). */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <string.h>

#include "vectors.h"

#if VBYTES == 64
#define RB 16 /* rows a block: the backward's RB partial rows of dx in registers (32 of AVX-512's) */
#else
#define RB 8  /* (16 of AVX2's) */
#endif
#define HB 8   /* the forward's rows at a time: HB x 2 sums in registers */
#define CT 512 /* columns a tile (forward) */

/* The block's rows: rows past the last one (a short final block) repeat the block's first row, and their results
   are not written. */
static void block_rows(const REAL *base, int64_t f, int64_t rows, const REAL **out) {
    for (int64_t i = 0; i < RB; i++) out[i] = base + (i < rows ? i : 0) * f;
}

/* t, r and mu of rows [r0, r0 + rows), rows <= RB. u (K * RB REALs) and uv (K * RB vectors): scratch. */
static void forward_block(const REAL *x, const REAL *v, const REAL *vs, int64_t f, int64_t k, int64_t r0,
                          int64_t rows, int centre, double eps, REAL *t, REAL *rr, REAL *mu, vreal *uv, REAL *u) {
    const REAL *xr[RB];
    block_rows(x + r0 * f, f, rows, xr);
    double s1[RB] = {0}, s2[RB] = {0};
    REAL piv[RB];
    for (int i = 0; i < RB; i++) piv[i] = xr[i][0];
    for (int64_t l = 0; l < k * RB; l++) {
        uv[l] = (vreal){0};
        u[l] = 0;
    }
    const int64_t fv = f - f % VL; /* columns in whole vectors */
    for (int64_t c0 = 0; c0 < f; c0 += CT) {
        const int64_t c1 = c0 + CT < f ? c0 + CT : f, cv = c1 < fv ? c1 : fv; /* [c0, cv): whole vectors */
        for (int i = 0; i < RB; i++) { /* the row's sums about its first value, this tile */
            REAL a1 = 0, a2 = 0;
            const REAL *xi = xr[i], p = piv[i];
#pragma omp simd reduction(+ : a1, a2)
            for (int64_t c = c0; c < c1; c++) {
                const REAL d = xi[c] - p;
                a1 += d;
                a2 += d * d;
            }
            s1[i] += a1;
            s2[i] += a2;
        }
        for (int h = 0; h < RB; h += HB) { /* HB rows at a time, V's rows two at a time */
            const REAL **xh = xr + h;
            int64_t j = 0;
            for (; j + 2 <= k; j += 2) {
                const REAL *va = v + j * f, *vb = va + f;
                vreal a[HB], b[HB];
                memcpy(a, uv + j * RB + h, sizeof a);
                memcpy(b, uv + (j + 1) * RB + h, sizeof b);
                for (int64_t c = c0; c < cv; c += VL) {
                    const vreal w0 = vload(va + c), w1 = vload(vb + c);
                    for (int i = 0; i < HB; i++) {
                        const vreal xi = vload(xh[i] + c);
                        a[i] += xi * w0;
                        b[i] += xi * w1;
                    }
                }
                memcpy(uv + j * RB + h, a, sizeof a);
                memcpy(uv + (j + 1) * RB + h, b, sizeof b);
            }
            for (; j < k; j++) {
                const REAL *va = v + j * f;
                vreal a[HB];
                memcpy(a, uv + j * RB + h, sizeof a);
                for (int64_t c = c0; c < cv; c += VL) {
                    const vreal w0 = vload(va + c);
                    for (int i = 0; i < HB; i++) a[i] += vload(xh[i] + c) * w0;
                }
                memcpy(uv + j * RB + h, a, sizeof a);
            }
        }
        for (int64_t j = 0; j < k; j++) /* the last F mod VL columns */
            for (int64_t c = cv > c0 ? cv : c0; c < c1; c++)
                for (int i = 0; i < RB; i++) u[j * RB + i] += xr[i][c] * v[j * f + c];
    }
    for (int64_t i = 0; i < rows; i++) {
        const double m1 = s1[i] / (double)f, mean = piv[i] + m1;
        double var = s2[i] / (double)f - m1 * m1;
        if (var < 0) var = 0;
        const double scale = 1.0 / sqrt((centre ? var : var + mean * mean) + eps), shift = centre ? mean : 0.0;
        rr[r0 + i] = (REAL)scale;
        mu[r0 + i] = (REAL)shift;
        for (int64_t j = 0; j < k; j++) {
            const double dot = (double)vsum(uv[j * RB + i]) + (double)u[j * RB + i];
            t[(r0 + i) * k + j] = (REAL)(scale * (dot - shift * (double)vs[j]));
        }
    }
}

/* The read's term of dx, ra_i g0 (the read h0 = sum_i a_i x_i of the same streams, whose backward left it here):
   row `row` holds `seg` segments of D = F / seg values, streams (row mod per) * seg + s of position row / per, so
   that HC's rows (one stream each: per = n, seg = 1) and mHC's (a position's n streams: per = 1, seg = n) both
   take a_i g0. Written, or added onto dx when `accumulate`. */
static void read_term(REAL *dxrow, const REAL *ra, const REAL *g0, int64_t row, int64_t f, int64_t per, int64_t seg,
                      int accumulate) {
    const int64_t d = f / seg, pos = row / per, n = per * seg;
    const REAL *restrict gp = g0 + pos * d;
    for (int64_t s = 0; s < seg; s++) {
        const REAL c = ra[pos * n + (row % per) * seg + s];
        REAL *restrict o = dxrow + s * d;
        if (accumulate) {
#pragma omp simd
            for (int64_t e = 0; e < d; e++) o[e] += c * gp[e];
        } else {
#pragma omp simd
            for (int64_t e = 0; e < d; e++) o[e] = c * gp[e];
        }
    }
}

/* dx (and dv, when not NULL) of rows [r0, r0 + rows), rows <= RB; with ra (not NULL), the read's term first, so
   that the block's rows of dx are in cache when the pass below updates them. gu: scratch of K * RB REALs. */
static void backward_block(const REAL *g, const REAL *x, const REAL *v, const REAL *vs, const REAL *rr,
                           const REAL *t, const REAL *mu, REAL *dx, REAL *dv, int64_t f, int64_t k, int64_t r0,
                           int64_t rows, int centre, int accumulate, const REAL *ra, const REAL *g0, int64_t per,
                           int64_t seg, REAL *gu) {
    if (ra) {
        for (int64_t i = 0; i < rows; i++) read_term(dx + (r0 + i) * f, ra, g0, r0 + i, f, per, seg, accumulate);
        accumulate = 1;
    }
    const REAL *xr[RB];
    block_rows(x + r0 * f, f, rows, xr);
    REAL alpha[RB], beta[RB], m[RB];
    REAL *dxr[RB];
    REAL spare[VL]; /* where a short block's extra rows write */
    for (int i = 0; i < RB; i++) {
        const int64_t row = r0 + (i < rows ? i : 0);
        const double r = rr[row];
        double gt = 0, gv = 0;
        for (int64_t j = 0; j < k; j++) {
            const double gj = g[row * k + j];
            gt += gj * (double)t[row * k + j];
            gv += gj * r * (double)vs[j];
            gu[j * RB + i] = i < rows ? (REAL)(gj * r) : 0; /* a short block's extra rows add nothing to dV */
        }
        const double a = -r * r * gt / (double)f;
        alpha[i] = (REAL)a;
        m[i] = centre ? mu[row] : 0;
        beta[i] = centre ? (REAL)((-gv - a * (double)mu[row] * (double)f) / (double)f) : 0;
        dxr[i] = i < rows ? dx + (r0 + i) * f : NULL;
    }
    int64_t c = 0;
    for (; c + VL <= f; c += VL) {
        vreal o[RB];
        for (int i = 0; i < RB; i++) {
            o[i] = alpha[i] * vload(xr[i] + c) + beta[i];
            if (accumulate && dxr[i]) o[i] += vload(dxr[i] + c);
        }
        for (int64_t j = 0; j < k; j++) {
            const REAL *gj = gu + j * RB;
            const vreal w = vload(v + j * f + c);
            for (int i = 0; i < RB; i++) o[i] += gj[i] * w;
        }
        for (int i = 0; i < RB; i++) vstore(dxr[i] ? dxr[i] + c : spare, o[i]);
        if (dv) { /* the block's columns again, from the first-level cache */
            vreal xm[RB];
            for (int i = 0; i < RB; i++) xm[i] = vload(xr[i] + c) - m[i];
            for (int64_t j = 0; j < k; j++) {
                const REAL *gj = gu + j * RB;
                vreal d0 = vload(dv + j * f + c), d1 = (vreal){0};
                for (int i = 0; i < RB; i += 2) {
                    d0 += gj[i] * xm[i];
                    d1 += gj[i + 1] * xm[i + 1];
                }
                vstore(dv + j * f + c, d0 + d1);
            }
        }
    }
    for (; c < f; c++) { /* the last F mod VL columns */
        for (int64_t i = 0; i < rows; i++) {
            REAL o = alpha[i] * xr[i][c] + beta[i] + (accumulate ? dxr[i][c] : 0);
            for (int64_t j = 0; j < k; j++) o += gu[j * RB + i] * v[j * f + c];
            dxr[i][c] = o;
        }
        if (dv)
            for (int64_t j = 0; j < k; j++)
                for (int64_t i = 0; i < rows; i++) dv[j * f + c] += gu[j * RB + i] * (xr[i][c] - m[i]);
    }
}

#define BLOCKS(r) (((r) + RB - 1) / RB)

/* In a parallel region: this thread's number, and its contiguous run [b0, b1) of nb blocks. */
static int share(int64_t nb, int64_t *b0, int64_t *b1) {
#ifdef _OPENMP
    const int id = omp_get_thread_num(), size = omp_get_num_threads();
#else
    const int id = 0, size = 1;
#endif
    *b0 = nb * id / size;
    *b1 = nb * (id + 1) / size;
    return id;
}

/* The forward's scratch a thread, in bytes: K * RB vectors and K * RB REALs, rounded up to whole 64-byte lines so
   that every thread's vectors are aligned (the caller's buffer is). */
int64_t NAME(forward_scratch)(int64_t k) {
    const int64_t bytes = k * RB * (int64_t)(sizeof(vreal) + sizeof(REAL));
    return (bytes + 63) / 64 * 64;
}

/* The backward's scratch a thread, in REALs. */
int64_t NAME(backward_scratch)(int64_t k) { return k * RB; }

/* t (R, K), rr and mu (R); scratch: NAME(forward_scratch)(K) bytes a thread, 64-byte aligned. Returns 0. */
int NAME(forward)(const REAL *x, const REAL *v, const REAL *vs, int64_t r, int64_t f, int64_t k, int centre,
                  double eps, REAL *t, REAL *rr, REAL *mu, void *scratch, int threads) {
    const size_t per = (size_t)NAME(forward_scratch)(k);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        int64_t b0, b1;
        char *mine = (char *)scratch + per * share(BLOCKS(r), &b0, &b1);
        for (int64_t b = b0; b < b1; b++)
            forward_block(x, v, vs, f, k, b * RB, r - b * RB < RB ? r - b * RB : RB, centre, eps, t, rr, mu,
                          (vreal *)mine, (REAL *)(mine + (size_t)k * RB * sizeof(vreal)));
    }
    (void)threads;
    return 0;
}

/* dx (R, F): written, or added onto when `accumulate`; dv_parts (threads, K, F), zero-filled by the caller, or
   NULL for no dV; ra (P, n) and g0 (P, F / seg), or NULL: the read's term a_i g0 added too (read_term); scratch:
   NAME(backward_scratch)(K) REALs a thread. Returns 0; 2 where per and seg do not divide the rows. */
int NAME(backward)(const REAL *g, const REAL *x, const REAL *v, const REAL *vs, const REAL *rr, const REAL *t,
                   const REAL *mu, int64_t r, int64_t f, int64_t k, int centre, int accumulate, REAL *dx,
                   REAL *dv_parts, const REAL *ra, const REAL *g0, int64_t per, int64_t seg, REAL *scratch,
                   int threads) {
    if (ra && (per < 1 || seg < 1 || r % per || f % seg)) return 2;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        int64_t b0, b1;
        const int id = share(BLOCKS(r), &b0, &b1);
        REAL *dv = dv_parts ? dv_parts + (int64_t)id * k * f : NULL;
        for (int64_t b = b0; b < b1; b++)
            backward_block(g, x, v, vs, rr, t, mu, dx, dv, f, k, b * RB, r - b * RB < RB ? r - b * RB : RB, centre,
                           accumulate, ra, g0, per, seg, scratch + (int64_t)id * k * RB);
    }
    (void)threads;
    return 0;
}
