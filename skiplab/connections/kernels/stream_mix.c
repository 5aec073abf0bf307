/* Hyper-connections' read and write of the n streams, position by position (stream_mix.py says why).

   x (P, n, D): n streams of D values per position; a (P, n), M (P, n, n), b (P, n): per-position coefficients.

       read:   h0 = sum_i a_i x_i                       (P, D)
       write:  out_j = sum_i M[j, i] x_i + b_j F        (P, n, D)

   Backward, with g the gradient at out and g0 at h0:
       write:  dx_i = sum_j M[j, i] g_j,  dM[j, i] = <g_j, x_i>,  dF = sum_j b_j g_j,  db_j = <g_j, F>
       read:   dx_i += a_i g0 (in place, onto the write's),  da_i = <x_i, g0>

   One position's rows (n + 1 or 2n + 1 rows of D) stay in the core's first-level cache while every product over
   them runs, so each tensor crosses main memory once. Compiled twice, with REAL = float and double (NAME appends
   _f32 / _f64); OpenMP threads (PyTorch's, as in add_group_norm.c) split the positions. */
#include <stdint.h>
#include <string.h>

#include "vectors.h"

/* <u, v> over d values, as four quarters summed side by side: four independent chains of vector additions, where
   one chain would wait on each addition's latency (the backward makes n^2 + n of these a position). */
static inline REAL dot(const REAL *restrict u, const REAL *restrict v, int64_t d) {
    const int64_t q = d / 4;
    REAL a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t k = 0; k < q; k++) {
        a0 += u[k] * v[k];
        a1 += u[k + q] * v[k + q];
        a2 += u[k + 2 * q] * v[k + 2 * q];
        a3 += u[k + 3 * q] * v[k + 3 * q];
    }
    for (int64_t k = 4 * q; k < d; k++) a0 += u[k] * v[k];
    return (a0 + a1) + (a2 + a3);
}

/* out = c row (first) or out += c row, over d values. */
static inline void axpy(REAL *restrict out, REAL c, const REAL *restrict row, int64_t d, int first) {
    if (first) {
#pragma omp simd
        for (int64_t k = 0; k < d; k++) out[k] = c * row[k];
    } else {
#pragma omp simd
        for (int64_t k = 0; k < d; k++) out[k] += c * row[k];
    }
}

/* read_forward and write_forward of one position with n = 4 (HC's and mHC's default): one pass over the D values,
   the position's four rows loaded once a vector and every output made from them in registers. */
static void read_forward_4(const REAL *xp, const REAL *ap, REAL *out, int64_t d) {
    int64_t k = 0;
    for (; k + VL <= d; k += VL)
        vstore(out + k, ap[0] * vload(xp + k) + ap[1] * vload(xp + d + k) + ap[2] * vload(xp + 2 * d + k) +
                            ap[3] * vload(xp + 3 * d + k));
    for (; k < d; k++) out[k] = ap[0] * xp[k] + ap[1] * xp[d + k] + ap[2] * xp[2 * d + k] + ap[3] * xp[3 * d + k];
}

static void write_forward_4(const REAL *xp, const REAL *mp, const REAL *fp, const REAL *bp, REAL *op, int64_t d) {
    int64_t k = 0;
    for (; k + VL <= d; k += VL) {
        const vreal x0 = vload(xp + k), x1 = vload(xp + d + k), x2 = vload(xp + 2 * d + k), x3 = vload(xp + 3 * d + k);
        const vreal f = vload(fp + k);
        for (int j = 0; j < 4; j++)
            vstore(op + j * d + k, bp[j] * f + mp[4 * j] * x0 + mp[4 * j + 1] * x1 + mp[4 * j + 2] * x2 +
                                       mp[4 * j + 3] * x3);
    }
    for (; k < d; k++)
        for (int j = 0; j < 4; j++)
            op[j * d + k] = bp[j] * fp[k] + mp[4 * j] * xp[k] + mp[4 * j + 1] * xp[d + k] +
                            mp[4 * j + 2] * xp[2 * d + k] + mp[4 * j + 3] * xp[3 * d + k];
}

void NAME(read_forward)(const REAL *x, const REAL *a, REAL *h0, int64_t p, int64_t n, int64_t d, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t pos = 0; pos < p; pos++) {
        const REAL *xp = x + pos * n * d, *ap = a + pos * n;
        REAL *restrict out = h0 + pos * d;
        if (n == 4) {
            read_forward_4(xp, ap, out, d);
            continue;
        }
        for (int64_t i = 0; i < n; i++) axpy(out, ap[i], xp + i * d, d, i == 0);
    }
    (void)threads;
}

void NAME(write_forward)(const REAL *x, const REAL *m, const REAL *f, const REAL *b, REAL *out, int64_t p,
                         int64_t n, int64_t d, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t pos = 0; pos < p; pos++) {
        const REAL *xp = x + pos * n * d, *mp = m + pos * n * n, *restrict fp = f + pos * d;
        if (n == 4) {
            write_forward_4(xp, mp, fp, b + pos * n, out + pos * n * d, d);
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            REAL *oj = out + (pos * n + j) * d;
            axpy(oj, b[pos * n + j], fp, d, 1);
            for (int64_t i = 0; i < n; i++) axpy(oj, mp[j * n + i], xp + i * d, d, 0);
        }
    }
    (void)threads;
}

/* write_backward of one position with n = 4 (HC's and mHC's default): one pass over the D values, every product
   of the position made from the same loads, the 16 + 4 sums in registers. */
static void write_backward_4(const REAL *gp, const REAL *xp, const REAL *mp, const REAL *fp, const REAL *bp,
                             REAL *dxp, REAL *dmp, REAL *dfp, REAL *dbp, int64_t d) {
    vreal adm[16], adb[4];
    for (int l = 0; l < 16; l++) adm[l] = (vreal){0};
    for (int l = 0; l < 4; l++) adb[l] = (vreal){0};
    int64_t k = 0;
    for (; k + VL <= d; k += VL) {
        vreal g[4], x[4];
        for (int j = 0; j < 4; j++) {
            g[j] = vload(gp + j * d + k);
            x[j] = vload(xp + j * d + k);
        }
        const vreal f = vload(fp + k);
        for (int i = 0; i < 4; i++)
            vstore(dxp + i * d + k, mp[i] * g[0] + mp[4 + i] * g[1] + mp[8 + i] * g[2] + mp[12 + i] * g[3]);
        vstore(dfp + k, bp[0] * g[0] + bp[1] * g[1] + bp[2] * g[2] + bp[3] * g[3]);
        for (int j = 0; j < 4; j++) {
            for (int i = 0; i < 4; i++) adm[j * 4 + i] += g[j] * x[i];
            adb[j] += g[j] * f;
        }
    }
    REAL dm[16], db[4];
    for (int l = 0; l < 16; l++) dm[l] = vsum(adm[l]);
    for (int l = 0; l < 4; l++) db[l] = vsum(adb[l]);
    for (; k < d; k++) { /* the last D mod VL values */
        REAL g[4], x[4];
        for (int j = 0; j < 4; j++) {
            g[j] = gp[j * d + k];
            x[j] = xp[j * d + k];
        }
        for (int i = 0; i < 4; i++)
            dxp[i * d + k] = mp[i] * g[0] + mp[4 + i] * g[1] + mp[8 + i] * g[2] + mp[12 + i] * g[3];
        dfp[k] = bp[0] * g[0] + bp[1] * g[1] + bp[2] * g[2] + bp[3] * g[3];
        for (int j = 0; j < 4; j++) {
            for (int i = 0; i < 4; i++) dm[j * 4 + i] += g[j] * x[i];
            db[j] += g[j] * fp[k];
        }
    }
    memcpy(dmp, dm, sizeof dm);
    memcpy(dbp, db, sizeof db);
}

void NAME(write_backward)(const REAL *g, const REAL *x, const REAL *m, const REAL *f, const REAL *b, REAL *dx,
                          REAL *dm, REAL *df, REAL *db, int64_t p, int64_t n, int64_t d, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t pos = 0; pos < p; pos++) {
        const REAL *gp = g + pos * n * d, *xp = x + pos * n * d, *mp = m + pos * n * n, *fp = f + pos * d;
        const REAL *bp = b + pos * n;
        REAL *restrict dfp = df + pos * d;
        if (n == 4) {
            write_backward_4(gp, xp, mp, fp, bp, dx + pos * n * d, dm + pos * n * n, dfp, db + pos * n, d);
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            const REAL *restrict gj = gp + j * d;
            for (int64_t i = 0; i < n; i++) dm[(pos * n + j) * n + i] = dot(gj, xp + i * d, d);
            db[pos * n + j] = dot(gj, fp, d);
            axpy(dfp, bp[j], gj, d, j == 0);
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) axpy(dx + (pos * n + i) * d, mp[j * n + i], gp + j * d, d, j == 0);
    }
    (void)threads;
}

/* read_backward of one position with n = 4: one pass, the four <x_i, g0> sums in registers. */
static void read_backward_4(const REAL *gp, const REAL *xp, const REAL *ap, REAL *dxp, REAL *dap, int64_t d,
                            int accumulate) {
    vreal acc[4] = {(vreal){0}, (vreal){0}, (vreal){0}, (vreal){0}};
    int64_t k = 0;
    for (; k + VL <= d; k += VL) {
        const vreal g = vload(gp + k);
        for (int i = 0; i < 4; i++) {
            acc[i] += vload(xp + i * d + k) * g;
            REAL *o = dxp + i * d + k;
            vstore(o, accumulate ? vload(o) + ap[i] * g : ap[i] * g);
        }
    }
    REAL da[4];
    for (int i = 0; i < 4; i++) da[i] = vsum(acc[i]);
    for (; k < d; k++)
        for (int i = 0; i < 4; i++) {
            da[i] += xp[i * d + k] * gp[k];
            dxp[i * d + k] = (accumulate ? dxp[i * d + k] : 0) + ap[i] * gp[k];
        }
    memcpy(dap, da, sizeof da);
}

/* dx += a_i g0 when accumulate, else dx = a_i g0; da_i = <x_i, g0>. dx NULL: da alone (the streams' projection
   kernel adds a_i g0 to dx in its own pass, norm_project.c). */
void NAME(read_backward)(const REAL *g0, const REAL *x, const REAL *a, REAL *dx, REAL *da, int64_t p, int64_t n,
                         int64_t d, int accumulate, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t pos = 0; pos < p; pos++) {
        const REAL *restrict gp = g0 + pos * d;
        if (!dx) {
            for (int64_t i = 0; i < n; i++) da[pos * n + i] = dot(x + (pos * n + i) * d, gp, d);
            continue;
        }
        if (n == 4) {
            read_backward_4(gp, x + pos * n * d, a + pos * n, dx + pos * n * d, da + pos * n, d, accumulate);
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            const REAL *restrict xi = x + (pos * n + i) * d;
            REAL *restrict dxi = dx + (pos * n + i) * d;
            da[pos * n + i] = dot(xi, gp, d);
            axpy(dxi, a[pos * n + i], gp, d, !accumulate);
        }
    }
    (void)threads;
}
