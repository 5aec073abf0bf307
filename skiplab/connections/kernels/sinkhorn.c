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

/* One half-step, along lines of n entries: line o holds m[o * os + e * es], e < n. T_c takes the columns
   (os = 1, es = n), T_r the rows (os = n, es = 1). Forward: y = m / s with s the line's sum; backward: g becomes
   (g - sum(g * y)) / s along the same lines. */
static void half_step(const double *m, double *y, double *s, int64_t n, int64_t os, int64_t es) {
    for (int64_t o = 0; o < n; o++) {
        double t = 0;
        for (int64_t e = 0; e < n; e++) t += m[o * os + e * es];
        s[o] = t;
        for (int64_t e = 0; e < n; e++) y[o * os + e * es] = m[o * os + e * es] / t;
    }
}

static void half_step_back(double *g, const double *y, const double *s, int64_t n, int64_t os, int64_t es) {
    for (int64_t o = 0; o < n; o++) {
        double t = 0;
        for (int64_t e = 0; e < n; e++) t += g[o * os + e * es] * y[o * os + e * es];
        for (int64_t e = 0; e < n; e++) g[o * os + e * es] = (g[o * os + e * es] - t) / s[o];
    }
}

/* The forward of one position into ys (2 iters + 1 matrices: m0, then each half-step's y) and ss (each half-step's
   n sums): half-step h is T_c for even h, T_r for odd. */
static void forward_one(const REAL *l, int64_t n, int64_t iters, double *ys, double *ss) {
    const int64_t nn = n * n;
    double top = l[0];
    for (int64_t e = 1; e < nn; e++)
        if (l[e] > top) top = l[e];
    for (int64_t e = 0; e < nn; e++) ys[e] = exp((double)l[e] - top);
    for (int64_t h = 0; h < 2 * iters; h++)
        half_step(ys + h * nn, ys + (h + 1) * nn, ss + h * n, n, h % 2 ? n : 1, h % 2 ? 1 : n);
}

/* Doubles of scratch a thread. */
int64_t NAME(scratch)(int64_t n, int64_t iters) { return (2 * iters + 1) * n * n + 2 * iters * n + n * n; }

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* out (P, n, n) from logits (P, n, n). */
void NAME(forward)(const REAL *logits, REAL *out, int64_t p, int64_t n, int64_t iters, double *scratch,
                   int threads) {
    const int64_t nn = n * n, per = NAME(scratch)(n, iters);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t pos = 0; pos < p; pos++) {
        double *ys = scratch + per * thread_id(), *ss = ys + (2 * iters + 1) * nn;
        forward_one(logits + pos * nn, n, iters, ys, ss);
        for (int64_t e = 0; e < nn; e++) out[pos * nn + e] = (REAL)ys[2 * iters * nn + e];
    }
    (void)threads;
}

/* dlogits (P, n, n) from logits and the gradient at the output, grad (P, n, n). */
void NAME(backward)(const REAL *logits, const REAL *grad, REAL *dlogits, int64_t p, int64_t n, int64_t iters,
                    double *scratch, int threads) {
    const int64_t nn = n * n, per = NAME(scratch)(n, iters);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t pos = 0; pos < p; pos++) {
        double *ys = scratch + per * thread_id(), *ss = ys + (2 * iters + 1) * nn, *g = ss + 2 * iters * n;
        forward_one(logits + pos * nn, n, iters, ys, ss);
        for (int64_t e = 0; e < nn; e++) g[e] = grad[pos * nn + e];
        for (int64_t h = 2 * iters - 1; h >= 0; h--)
            half_step_back(g, ys + (h + 1) * nn, ss + h * n, n, h % 2 ? n : 1, h % 2 ? 1 : n);
        for (int64_t e = 0; e < nn; e++) dlogits[pos * nn + e] = (REAL)(g[e] * ys[e]);
    }
    (void)threads;
}
