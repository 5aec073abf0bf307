/* The add + GroupNorm(1) chain of a conv-layout connection, one example at a time (add_group_norm.py says why).
   Norms are counted from 0 here (add_group_norm.py counts from 1):

       h_0 = a*s + cf*F,   y_i = GN_i(h_i),   h_{i+1} = s + y_i   (i = 0..k-1),   out = y_{k-1}

   GN_i(h) = (h - mu_i) * r_i * w_i[c] + b_i[c], mu_i and r_i = 1/sqrt(var_i + eps) over the C*HW values of one
   example. Each norm needs statistics of the whole example before anything after it can be computed, so the
   kernel runs over an example in passes (k + 1 each way), and each pass recomputes the chain from s and F (and dy)
   rather than reading back values an earlier pass wrote: after its first pass an example's inputs are in the
   core's cache, so forward reads s and F and writes out once, backward reads s, F and dy and writes ds and dF
   once, and nothing else crosses memory or is written between passes (a version that kept the h_i in buffers
   between passes took 2.67-2.87 ms against 2.26-2.47 for the chain forward and backward at R-56's first stage:
   docs/performance.md). Each pass runs channel by channel, so w_i[c] and b_i[c] are constants of the inner loop.
   y is (h - mu) * (r w) + b, not h * (r w) + (b - mu r w): a mean large against the spread would make the second
   the difference of two large numbers.

   Statistics: the sums of (h - p) and (h - p)^2 about a pivot p (the example's first h value), in REAL over a
   channel (or over channels together until FLUSH positions, where channels are smaller), across those blocks in
   double; var = (S2 - S1^2/m)/m. The pivot keeps the difference of the two sums from cancelling when the mean is
   large against the spread.

   Compiled twice, with REAL = float and double (NAME appends _f32 / _f64). Threads split the examples. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>

#include "vectors.h"

typedef struct {
    const REAL *s, *f, *dy, *w, *b;
    REAL *out, *mean, *rstd, *ds, *df;
    double *dw, *db; /* this thread's sums, k*C each (backward) */
    double a, cf, eps;
    int64_t n0, n1, n, c, hw, k;
    int failed;
} job_t;

typedef struct { double s1, s2; REAL pivot; } moments_t;

#define MAX_K 8 /* the longest chain (norms) a call may have: add_group_norm.py checks it */

static inline void moments_end(const moments_t *mo, int64_t m, double eps, REAL *mu, REAL *r) {
    const double d = mo->s1 / (double)m, var = mo->s2 / (double)m - d * d;
    *mu = (REAL)(mo->pivot + d);
    *r = (REAL)(1.0 / sqrt((var > 0.0 ? var : 0.0) + eps));
}

/* One example's constants: the chain's a and cf, each norm's mu_i and r_i, and (set per channel by channel())
   w_i[ch], sc_i = r_i w_i[ch], sh_i = b_i[ch]; backward, each norm's mean(g w_i) and mean(g w_i x̂_i). */
typedef struct {
    REAL a, cf, mu[MAX_K], r[MAX_K], wc[MAX_K], sc[MAX_K], sh[MAX_K], mg[MAX_K], mgx[MAX_K];
} consts_t;

#define ALWAYS static inline __attribute__((always_inline))

ALWAYS void channel(const job_t *t, int64_t ch, consts_t *q, int upto) {
#pragma GCC unroll 8
    for (int i = 0; i < upto; i++) {
        q->wc[i] = t->w[i * t->c + ch];
        q->sc[i] = q->r[i] * q->wc[i];
        q->sh[i] = t->b[i * t->c + ch];
    }
}

/* The chain at a position, written once for a vector of positions (T = vreal, the loops' body) and for one (T =
   REAL, the last hw mod VL positions of a channel):
     last:  h_upto, with h_0 = a s + cf F and h_{i+1} = s + GN_i(h_i);
     all:   h_0 .. h_upto into hh;
     grad:  dh_i = r_i (g w_i - mean(g w_i) - x̂_i mean(g w_i x̂_i)) from g, the gradient at y_i.
   With k a constant (forward_k's and backward_k's cases) the loops unroll and hh lives in registers. */
#define CHAIN(T, SUF)                                                                                           \
    ALWAYS T last_##SUF(T sv, T fv, const consts_t *q, int upto) {                                              \
        T h = q->a * sv + q->cf * fv;                                                                           \
        _Pragma("GCC unroll 8") for (int i = 0; i < upto; i++) h = sv + ((h - q->mu[i]) * q->sc[i] + q->sh[i]); \
        return h;                                                                                               \
    }                                                                                                           \
    ALWAYS void all_##SUF(T *hh, T sv, T fv, const consts_t *q, int upto) {                                     \
        hh[0] = q->a * sv + q->cf * fv;                                                                         \
        _Pragma("GCC unroll 8") for (int i = 0; i < upto; i++)                                                  \
            hh[i + 1] = sv + ((hh[i] - q->mu[i]) * q->sc[i] + q->sh[i]);                                        \
    }                                                                                                           \
    ALWAYS T grad_##SUF(T g, const T *hh, const consts_t *q, int i) {                                           \
        return q->r[i] * (g * q->wc[i] - q->mg[i] - (hh[i] - q->mu[i]) * q->r[i] * q->mgx[i]);                  \
    }
CHAIN(vreal, v)
CHAIN(REAL, s)

/* The sums of the passes run ACC vectors of positions at a time into ACC separate sums: with one, each vector would
   wait for the previous one's addition (its latency), not for its loads. */
#define ACC 4

/* The moments are summed in REAL over a channel's positions, or over channels together until FLUSH positions where
   channels are smaller (R-56's last stage: 64), then added into double: one vector reduction per FLUSH positions,
   not per channel. */
#define FLUSH 1024

/* One vector of positions' share of the moments of h_p, about the pivot pv. */
ALWAYS void moments_step(vreal *s1, vreal *s2, const REAL *sv, const REAL *fv, const consts_t *q, int p, REAL pv) {
    const vreal d = last_v(vload(sv), vload(fv), q, p) - pv;
    *s1 += d;
    *s2 += d * d;
}

/* One vector of positions' share of norm p's channel sums of g and g x̂_p, g the gradient at y_p (from dy through
   the norms after p). */
ALWAYS void sums_step(vreal *sg, vreal *sgx, const REAL *sv, const REAL *fv, const REAL *gv, const consts_t *q, int p,
                      const int k) {
    vreal hh[MAX_K], g = vload(gv);
    all_v(hh, vload(sv), vload(fv), q, k - 1);
#pragma GCC unroll 8
    for (int i = k - 1; i > p; i--) g = grad_v(g, hh, q, i);
    *sg += g;
    *sgx += g * ((hh[p] - q->mu[p]) * q->r[p]);
}

/* The next example's inputs fetched into the cache while this example's later passes run from it, a share of their
   lines at each channel of those passes: without it memory would be busy in each example's first pass and idle in
   the others. */
typedef struct {
    const char *next[5];
    int reads, writes; /* the first `reads` of next are read, the `writes` after them written; 0, 0: no next example */
    int64_t done, due, per, rem, carry, steps;
} ahead_t;

/* `lines` lines spread over `steps` steps: by the end of step i, lines * i / steps of them (rounded down) are due,
   counted as per = lines / steps a step and a carry of the remainder, so that a step needs no division. */
static ahead_t ahead_start(const REAL *const *next, int reads, int writes, int64_t m, int64_t steps) {
    const int64_t lines = (m * (int64_t)sizeof(REAL) + 63) / 64;
    ahead_t a = {.reads = reads, .writes = writes, .per = lines / steps, .rem = lines % steps, .steps = steps};
    for (int i = 0; i < reads + writes; i++) a.next[i] = (const char *)next[i];
    return a;
}

/* One step of `steps`: the lines due by its end (into L2: locality 2; the outputs' lines for writing). */
static inline void ahead_step(ahead_t *a) {
    if (a->reads + a->writes == 0) return;
    a->due += a->per;
    if ((a->carry += a->rem) >= a->steps) {
        a->carry -= a->steps;
        a->due++;
    }
    for (; a->done < a->due; a->done++) {
        for (int i = 0; i < a->reads; i++) __builtin_prefetch(a->next[i] + a->done * 64, 0, 2);
        for (int i = a->reads; i < a->reads + a->writes; i++) __builtin_prefetch(a->next[i] + a->done * 64, 1, 2);
    }
}

/* Forward of one example in k + 1 passes over s and F, nothing written between them: pass p < k takes the moments
   of h_p (the chain recomputed through the norms before it), pass k writes out = y_{k-1}. After the first pass the
   example's s and F are in the core's cache, so it crosses memory once each way. */
ALWAYS void forward_k(const job_t *t, int64_t ex, ahead_t *ah, const int k) {
    const int64_t c = t->c, hw = t->hw, m = c * hw, n = t->n;
    const REAL *s = t->s + ex * m, *f = t->f + ex * m;
    REAL *out = t->out + ex * m;
    consts_t q = {.a = (REAL)t->a, .cf = (REAL)t->cf};
    if (k > MAX_K) __builtin_unreachable(); /* run() checks it */
#pragma GCC unroll 8
    for (int p = 0; p < k; p++) { /* the moments of h_p, about the example's first h_p */
        channel(t, 0, &q, p);
        const REAL pv = last_s(s[0], f[0], &q, p);
        moments_t mo = {0.0, 0.0, pv};
        vreal s1v[ACC] = {{0}}, s2v[ACC] = {{0}};
        REAL s1 = 0, s2 = 0; /* the positions past the last whole vector of each channel */
        int64_t run = 0;     /* positions summed in REAL since the last flush into the double sums */
        for (int64_t ch = 0; ch < c; ch++) {
            if (p > 0) ahead_step(ah);
            channel(t, ch, &q, p);
            const REAL *sc = s + ch * hw, *fc = f + ch * hw;
            int64_t j = 0;
            for (; j + ACC * VL <= hw; j += ACC * VL)
#pragma GCC unroll 4
                for (int u = 0; u < ACC; u++)
                    moments_step(s1v + u, s2v + u, sc + j + u * VL, fc + j + u * VL, &q, p, pv);
            for (; j + VL <= hw; j += VL) moments_step(s1v, s2v, sc + j, fc + j, &q, p, pv);
            for (; j < hw; j++) {
                const REAL d = last_s(sc[j], fc[j], &q, p) - pv;
                s1 += d;
                s2 += d * d;
            }
            if ((run += hw) < FLUSH && ch + 1 < c) continue;
            for (int u = 1; u < ACC; u++) {
                s1v[0] += s1v[u];
                s2v[0] += s2v[u];
            }
            mo.s1 += (double)vsum(s1v[0]) + s1;
            mo.s2 += (double)vsum(s2v[0]) + s2;
            for (int u = 0; u < ACC; u++) s1v[u] = s2v[u] = (vreal){0};
            s1 = s2 = 0;
            run = 0;
        }
        moments_end(&mo, m, t->eps, &q.mu[p], &q.r[p]);
        t->mean[p * n + ex] = q.mu[p];
        t->rstd[p * n + ex] = q.r[p];
    }
    const int l = k - 1;
    for (int64_t ch = 0; ch < c; ch++) { /* out = y_{k-1} */
        ahead_step(ah);
        channel(t, ch, &q, k);
        const REAL *sc = s + ch * hw, *fc = f + ch * hw;
        REAL *oc = out + ch * hw;
        int64_t j = 0;
        for (; j + VL <= hw; j += VL)
            vstore(oc + j, (last_v(vload(sc + j), vload(fc + j), &q, l) - q.mu[l]) * q.sc[l] + q.sh[l]);
        for (; j < hw; j++) oc[j] = (last_s(sc[j], fc[j], &q, l) - q.mu[l]) * q.sc[l] + q.sh[l];
    }
}

static void forward_example(const job_t *t, int64_t ex) {
    const int64_t m = t->c * t->hw;
    const REAL *next[3] = {t->s + (ex + 1) * m, t->f + (ex + 1) * m, t->out + (ex + 1) * m};
    const int more = ex + 1 < t->n1;
    ahead_t ah = ahead_start(next, more ? 2 : 0, more, m, t->c * t->k); /* k later passes of c channels */
    switch (t->k) {
    case 1: forward_k(t, ex, &ah, 1); break;
    case 2: forward_k(t, ex, &ah, 2); break;
    default: forward_k(t, ex, &ah, (int)t->k);
    }
}

/* Backward of one example in k + 1 passes over s, F and dy, nothing written between them. With g the gradient at
   y_i (dy for the last norm) and x̂_i = (h_i - mu_i) r_i:

       dh_i = r_i (g w_i - mean(g w_i) - x̂_i mean(g w_i x̂_i)),   the gradient at y_{i-1} (i > 0),
       ds = a dh_0 + sum_{i >= 1} dh_i,   dF = cf dh_0.

   Pass p = k-1 .. 0 recomputes the h_i, and the dh_i of the norms after p (their means known from the passes
   before), and takes norm p's channel sums of g and g x̂_p (dw_p, db_p and its two means); the last pass writes
   ds and dF. */
ALWAYS void backward_k(const job_t *t, int64_t ex, double *cg, double *cgx, ahead_t *ah, const int k) {
    const int64_t c = t->c, hw = t->hw, m = c * hw, n = t->n;
    const REAL *s = t->s + ex * m, *f = t->f + ex * m, *dy = t->dy + ex * m;
    REAL *ds = t->ds + ex * m, *df = t->df + ex * m;
    consts_t q = {.a = (REAL)t->a, .cf = (REAL)t->cf};
    if (k > MAX_K) __builtin_unreachable(); /* run() checks it */
    for (int i = 0; i < k; i++) {
        q.mu[i] = t->mean[i * n + ex];
        q.r[i] = t->rstd[i * n + ex];
    }
#pragma GCC unroll 8
    for (int p = k - 1; p >= 0; p--) { /* norm p's channel sums */
        for (int64_t ch = 0; ch < c; ch++) {
            if (p < k - 1) ahead_step(ah);
            channel(t, ch, &q, k);
            const REAL *sc = s + ch * hw, *fc = f + ch * hw, *gc = dy + ch * hw;
            vreal sgv[ACC] = {{0}}, sgxv[ACC] = {{0}};
            int64_t j = 0;
            for (; j + ACC * VL <= hw; j += ACC * VL)
#pragma GCC unroll 4
                for (int u = 0; u < ACC; u++)
                    sums_step(sgv + u, sgxv + u, sc + j + u * VL, fc + j + u * VL, gc + j + u * VL, &q, p, k);
            for (; j + VL <= hw; j += VL) sums_step(sgv, sgxv, sc + j, fc + j, gc + j, &q, p, k);
            for (int u = 1; u < ACC; u++) {
                sgv[0] += sgv[u];
                sgxv[0] += sgxv[u];
            }
            REAL sg = vsum(sgv[0]), sgx = vsum(sgxv[0]);
            for (; j < hw; j++) {
                REAL hh[MAX_K], g = gc[j];
                all_s(hh, sc[j], fc[j], &q, k - 1);
#pragma GCC unroll 8
                for (int i = k - 1; i > p; i--) g = grad_s(g, hh, &q, i);
                sg += g;
                sgx += g * ((hh[p] - q.mu[p]) * q.r[p]);
            }
            cg[ch] = sg;
            cgx[ch] = sgx;
        }
        double sum_g = 0.0, sum_gx = 0.0;
        for (int64_t ch = 0; ch < c; ch++) {
            const double w = t->w[p * c + ch];
            t->dw[p * c + ch] += cgx[ch];
            t->db[p * c + ch] += cg[ch];
            sum_g += cg[ch] * w;
            sum_gx += cgx[ch] * w;
        }
        q.mg[p] = (REAL)(sum_g / (double)m);
        q.mgx[p] = (REAL)(sum_gx / (double)m);
    }
    for (int64_t ch = 0; ch < c; ch++) { /* ds and dF; rest: the dh_i, i >= 1, summed for ds */
        ahead_step(ah);
        channel(t, ch, &q, k);
        const REAL *sc = s + ch * hw, *fc = f + ch * hw, *gc = dy + ch * hw;
        REAL *dsc = ds + ch * hw, *dfc = df + ch * hw;
        int64_t j = 0;
        for (; j + VL <= hw; j += VL) {
            vreal hh[MAX_K], g = vload(gc + j), rest = {0};
            all_v(hh, vload(sc + j), vload(fc + j), &q, k - 1);
#pragma GCC unroll 8
            for (int i = k - 1; i > 0; i--) rest += (g = grad_v(g, hh, &q, i));
            const vreal dh = grad_v(g, hh, &q, 0);
            vstore(dsc + j, rest + q.a * dh);
            vstore(dfc + j, q.cf * dh);
        }
        for (; j < hw; j++) {
            REAL hh[MAX_K], g = gc[j], rest = 0;
            all_s(hh, sc[j], fc[j], &q, k - 1);
#pragma GCC unroll 8
            for (int i = k - 1; i > 0; i--) rest += (g = grad_s(g, hh, &q, i));
            const REAL dh = grad_s(g, hh, &q, 0);
            dsc[j] = rest + q.a * dh;
            dfc[j] = q.cf * dh;
        }
    }
}

static void backward_example(const job_t *t, int64_t ex, double *cg, double *cgx) {
    const int64_t m = t->c * t->hw;
    const REAL *next[5] = {t->s + (ex + 1) * m, t->f + (ex + 1) * m, t->dy + (ex + 1) * m, t->ds + (ex + 1) * m,
                           t->df + (ex + 1) * m};
    const int more = ex + 1 < t->n1;
    ahead_t ah = ahead_start(next, more ? 3 : 0, more ? 2 : 0, m, t->c * t->k); /* k later passes of c channels */
    switch (t->k) {
    case 1: backward_k(t, ex, cg, cgx, &ah, 1); break;
    case 2: backward_k(t, ex, cg, cgx, &ah, 2); break;
    default: backward_k(t, ex, cg, cgx, &ah, (int)t->k);
    }
}

static void *forward_job(void *arg) {
    job_t *t = arg;
    for (int64_t ex = t->n0; ex < t->n1; ex++) forward_example(t, ex);
    return NULL;
}

static void *backward_job(void *arg) {
    job_t *t = arg;
    double *sums = malloc(sizeof(double) * 2 * t->c);
    t->failed = sums == NULL;
    for (int64_t ex = t->n0; ex < t->n1 && sums; ex++) backward_example(t, ex, sums, sums + t->c);
    free(sums);
    return NULL;
}

/* Splits the examples over up to `threads` OpenMP threads. Built with -fopenmp, this library needs libgomp.so.1,
   which the loader finds already loaded by PyTorch: the kernel shares the threads of PyTorch's own parallel
   regions rather than starting threads beside them (which would compete with those threads while they spin
   waiting for work). Built without OpenMP, it runs on one thread. The backward's per-thread sums are added in
   thread order, so a thread count gives one result. */
static int run(job_t *base, int threads, void *(*fn)(void *), int backward) {
    if (threads > base->n) threads = (int)base->n;
    if (threads < 1) threads = 1;
#ifndef _OPENMP
    threads = 1;
#endif
    const int64_t kc = base->k * base->c;
    job_t *jobs = calloc(threads, sizeof(job_t));
    double *sums = backward ? calloc((size_t)threads * 2 * kc, sizeof(double)) : NULL;
    if (!jobs || (backward && !sums)) {
        free(jobs);
        free(sums);
        return 1;
    }
    int team = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        const int i = omp_get_thread_num(), size = omp_get_num_threads();
#else
        const int i = 0, size = 1;
#endif
        if (i == 0) team = size;
        job_t *t = jobs + i;
        *t = *base;
        t->n0 = base->n * i / size;
        t->n1 = base->n * (i + 1) / size;
        if (backward) {
            t->dw = sums + 2 * kc * i;
            t->db = t->dw + kc;
        }
        fn(t);
    }
    int failed = 0;
    for (int i = 0; i < team; i++) failed |= jobs[i].failed;
    if (backward && !failed) {
        for (int64_t j = 0; j < kc; j++) {
            double dw = 0.0, db = 0.0;
            for (int i = 0; i < team; i++) {
                dw += sums[2 * kc * i + j];
                db += sums[2 * kc * i + kc + j];
            }
            base->dw[j] = dw;
            base->db[j] = db;
        }
    }
    free(jobs);
    free(sums);
    return failed;
}

/* out (n*c*hw); mean and rstd (k*n). Returns 0; 1 when memory could not be had; 2 for k outside 1..MAX_K. */
int NAME(forward)(const REAL *s, const REAL *f, const REAL *w, const REAL *b, double a, double cf, double eps,
                  int64_t n, int64_t c, int64_t hw, int64_t k, REAL *out, REAL *mean, REAL *rstd, int threads) {
    job_t t = {.s = s, .f = f, .w = w, .b = b, .out = out, .mean = mean, .rstd = rstd,
               .a = a, .cf = cf, .eps = eps, .n = n, .c = c, .hw = hw, .k = k};
    if (k < 1 || k > MAX_K) return 2;
    return run(&t, threads, forward_job, 0);
}

/* ds, df (n*c*hw); dw, db (k*c, double). mean and rstd as forward wrote them. Returns 0, or 1 as forward. */
int NAME(backward)(const REAL *s, const REAL *f, const REAL *w, const REAL *b, double a, double cf, const REAL *dy,
                   const REAL *mean, const REAL *rstd, int64_t n, int64_t c, int64_t hw, int64_t k,
                   REAL *ds, REAL *df, double *dw, double *db, int threads) {
    job_t t = {.s = s, .f = f, .w = w, .b = b, .dy = dy, .mean = (REAL *)mean, .rstd = (REAL *)rstd,
               .ds = ds, .df = df, .dw = dw, .db = db, .a = a, .cf = cf, .n = n, .c = c, .hw = hw, .k = k};
    if (k < 1 || k > MAX_K) return 2;
    return run(&t, threads, backward_job, 1);
}
