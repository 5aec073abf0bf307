/* mHC's Sinkhorn-Knopp projection, one position's n x n matrix at a time (sinkhorn.py says why).

   Forward, from logits l (n, n):  m0 = exp(l - max l);  iters times: T_c (each column divided by its sum over the
   rows), then T_r (each row divided by its sum over the columns). Backward of each half-step y = m / s, s the sums
   along one axis: dm = (g - sum(g * y)) / s along the same axis; then dl = g * m0.

   The backward recomputes the forward of its position (n^2 values, 2 iters half-steps) into a scratch of
   (2 iters + 1) n^2 + 2 iters n doubles a thread, so nothing but the logits is kept between the passes. Sums and
   quotients in double whatever REAL is. Compiled twice, with REAL = float and double (NAME appends _f32 / _f64);
   OpenMP threads (PyTorch's, as in add_group_norm.c) split the positions. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>

/* The forward of one position into ys (2 iters + 1 matrices: m0, then each half-step's y) and ss (each half-step's
   n sums). */
static void forward_one(const REAL *l, int64_t n, int64_t iters, double *ys, double *ss) {
    const int64_t nn = n * n;
    double top = l[0];
    for (int64_t e = 1; e < nn; e++)
        if (l[e] > top) top = l[e];
    for (int64_t e = 0; e < nn; e++) ys[e] = exp((double)l[e] - top);
    for (int64_t h = 0; h < 2 * iters; h++) {
        const double *m = ys + h * nn;
        double *y = ys + (h + 1) * nn, *s = ss + h * n;
        if (h % 2 == 0) { /* T_c: s_j = sum_i m[i][j] */
            for (int64_t j = 0; j < n; j++) {
                double t = 0;
                for (int64_t i = 0; i < n; i++) t += m[i * n + j];
                s[j] = t;
            }
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < n; j++) y[i * n + j] = m[i * n + j] / s[j];
        } else { /* T_r: s_i = sum_j m[i][j] */
            for (int64_t i = 0; i < n; i++) {
                double t = 0;
                for (int64_t j = 0; j < n; j++) t += m[i * n + j];
                s[i] = t;
            }
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < n; j++) y[i * n + j] = m[i * n + j] / s[i];
        }
    }
}

/* Doubles of scratch a thread. */
int64_t NAME(scratch)(int64_t n, int64_t iters) { return (2 * iters + 1) * n * n + 2 * iters * n + n * n; }

/* out (P, n, n) from logits (P, n, n). */
void NAME(forward)(const REAL *logits, REAL *out, int64_t p, int64_t n, int64_t iters, double *scratch,
                   int threads) {
    const int64_t nn = n * n, per = NAME(scratch)(n, iters);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        const int id = omp_get_thread_num();
#pragma omp for schedule(static)
#else
        const int id = 0;
#endif
        for (int64_t pos = 0; pos < p; pos++) {
            double *ys = scratch + per * id, *ss = ys + (2 * iters + 1) * nn;
            forward_one(logits + pos * nn, n, iters, ys, ss);
            const double *y = ys + 2 * iters * nn;
            for (int64_t e = 0; e < nn; e++) out[pos * nn + e] = (REAL)y[e];
        }
    }
    (void)threads;
}

/* dlogits (P, n, n) from logits and the gradient at the output, grad (P, n, n). */
void NAME(backward)(const REAL *logits, const REAL *grad, REAL *dlogits, int64_t p, int64_t n, int64_t iters,
                    double *scratch, int threads) {
    const int64_t nn = n * n, per = NAME(scratch)(n, iters);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        const int id = omp_get_thread_num();
#pragma omp for schedule(static)
#else
        const int id = 0;
#endif
        for (int64_t pos = 0; pos < p; pos++) {
            double *ys = scratch + per * id, *ss = ys + (2 * iters + 1) * nn, *g = ss + 2 * iters * n;
            forward_one(logits + pos * nn, n, iters, ys, ss);
            for (int64_t e = 0; e < nn; e++) g[e] = grad[pos * nn + e];
            for (int64_t h = 2 * iters - 1; h >= 0; h--) {
                const double *y = ys + (h + 1) * nn, *s = ss + h * n;
                if (h % 2 == 0) { /* T_c: along the rows of each column */
                    for (int64_t j = 0; j < n; j++) {
                        double t = 0;
                        for (int64_t i = 0; i < n; i++) t += g[i * n + j] * y[i * n + j];
                        for (int64_t i = 0; i < n; i++) g[i * n + j] = (g[i * n + j] - t) / s[j];
                    }
                } else { /* T_r: along the columns of each row */
                    for (int64_t i = 0; i < n; i++) {
                        double t = 0;
                        for (int64_t j = 0; j < n; j++) t += g[i * n + j] * y[i * n + j];
                        for (int64_t j = 0; j < n; j++) g[i * n + j] = (g[i * n + j] - t) / s[i];
                    }
                }
            }
            for (int64_t e = 0; e < nn; e++) dlogits[pos * nn + e] = (REAL)(g[e] * ys[e]);
        }
    }
    (void)threads;
}
