/* The add + GroupNorm(1) chain of a conv-layout connection, one example at a time (add_group_norm.py says why).

       h_1 = a*s + cf*F,   y_i = GN_i(h_i),   h_{i+1} = s + y_i   (i = 1..k),   out = y_k

   GN_i(h) = (h - mu_i) * r_i * w_i[c] + b_i[c], mu_i and r_i = 1/sqrt(var_i + eps) over the C*HW values of one
   example. One example's tensors stay in a core's cache while the chain runs over them: forward reads s and F
   and writes out once; backward reads s, F and dy and writes ds and dF once (the h_i are recomputed from s, F
   and the saved mu_i, r_i). Each pass over an example runs channel by channel, so w_i[c] and b_i[c] are
   constants of the inner loop. y is (h - mu) * (r w) + b, not h * (r w) + (b - mu r w): a mean large against the
   spread would make the second the difference of two large numbers.

   Statistics: the sums of (h - p) and (h - p)^2 about a pivot p (the example's first h value), per channel in
   REAL, across channels in double; var = (S2 - S1^2/m)/m. The pivot keeps the difference of the two sums from
   cancelling when the mean is large against the spread.

   Compiled twice, with REAL = float and double (NAME appends _f32 / _f64). Threads split the examples. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const REAL *s, *f, *dy, *w, *b;
    REAL *out, *mean, *rstd, *ds, *df;
    double *dw, *db; /* this thread's sums, k*C each (backward) */
    double a, cf, eps;
    int64_t n0, n1, n, c, hw, k;
    int failed;
} job_t;

typedef struct { double s1, s2; REAL pivot; } moments_t;

static inline void moments_add(moments_t *mo, const REAL *h, int64_t len) {
    const REAL p = mo->pivot;
    REAL s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
    for (int64_t j = 0; j < len; j++) {
        const REAL d = h[j] - p;
        s1 += d;
        s2 += d * d;
    }
    mo->s1 += s1;
    mo->s2 += s2;
}

static inline void moments_end(const moments_t *mo, int64_t m, double eps, REAL *mu, REAL *r) {
    const double d = mo->s1 / (double)m, var = mo->s2 / (double)m - d * d;
    *mu = (REAL)(mo->pivot + d);
    *r = (REAL)(1.0 / sqrt((var > 0.0 ? var : 0.0) + eps));
}

/* 4K aliasing: a load whose address matches a pending store's in its low 12 bits waits for that store, so
   streams read and written in one loop should sit at different offsets within a page. The scratch buffers
   have a page of slack each; place() puts buffer `count` of a job at the 64-byte offset farthest from the
   offsets already taken (this example's tensors and the buffers placed before it). */
#define SLACK 4096
#define MAX_K 8 /* the longest chain (norms) a call may have: add_group_norm.py checks it */
static REAL *place(char *raw, uintptr_t *taken, int count) {
    uintptr_t best = 0, best_gap = 0;
    for (uintptr_t cand = 0; cand < SLACK; cand += 64) {
        const uintptr_t at = ((uintptr_t)raw + cand) % SLACK;
        uintptr_t gap = SLACK;
        for (int i = 0; i < count; i++) {
            const uintptr_t d = (at - taken[i]) % SLACK, e = SLACK - d;
            gap = d < gap ? d : gap;
            gap = e < gap ? e : gap;
        }
        if (gap > best_gap) { best_gap = gap; best = cand; }
    }
    taken[count] = ((uintptr_t)raw + best) % SLACK;
    return (REAL *)(raw + best);
}

/* Forward of one example: h_i in buf, in place, and out = y_k. */
static void forward_example(const job_t *t, int64_t ex, char *raw) {
    const int64_t c = t->c, hw = t->hw, m = c * hw, n = t->n;
    const REAL *s = t->s + ex * m, *f = t->f + ex * m;
    uintptr_t taken[4] = {(uintptr_t)s % SLACK, (uintptr_t)f % SLACK, (uintptr_t)(t->out + ex * m) % SLACK};
    REAL *buf = place(raw, taken, 3);
    const REAL a = (REAL)t->a, cf = (REAL)t->cf;
    moments_t mo = {0.0, 0.0, a * s[0] + cf * f[0]};
    for (int64_t ch = 0; ch < c; ch++) { /* h_1 and its moments */
        const REAL *sc = s + ch * hw, *fc = f + ch * hw;
        REAL *hc = buf + ch * hw;
#pragma omp simd
        for (int64_t j = 0; j < hw; j++) hc[j] = a * sc[j] + cf * fc[j];
        moments_add(&mo, hc, hw);
    }
    for (int64_t i = 0; i < t->k; i++) {
        REAL mu, r;
        moments_end(&mo, m, t->eps, &mu, &r);
        t->mean[i * n + ex] = mu;
        t->rstd[i * n + ex] = r;
        const REAL *w = t->w + i * c, *b = t->b + i * c;
        const int last = i + 1 == t->k;
        REAL *dst = last ? t->out + ex * m : buf;
        mo = (moments_t){0.0, 0.0, (buf[0] - mu) * (r * w[0]) + b[0] + s[0]};
        for (int64_t ch = 0; ch < c; ch++) { /* y_i, then h_{i+1} = s + y_i and its moments */
            const REAL scale = r * w[ch], shift = b[ch];
            const REAL *hc = buf + ch * hw, *sc = s + ch * hw;
            REAL *dc = dst + ch * hw;
            if (last) {
#pragma omp simd
                for (int64_t j = 0; j < hw; j++) dc[j] = (hc[j] - mu) * scale + shift;
            } else {
#pragma omp simd
                for (int64_t j = 0; j < hw; j++) dc[j] = (hc[j] - mu) * scale + shift + sc[j];
                moments_add(&mo, dc, hw);
            }
        }
    }
}

/* Backward of one example. hs: k*m (the h_i), g: m (the gradient at y_i), acc: m (ds so far). */
/* The channel sums of g and g * xhat for a norm with statistics mu, r over h: into cg[ch], cgx[ch]. */
static inline void grad_sums(const REAL *restrict g, const REAL *restrict h, int64_t hw, REAL mu, REAL r,
                             double *cg, double *cgx) {
    REAL sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t j = 0; j < hw; j++) {
        sg += g[j];
        sgx += g[j] * ((h[j] - mu) * r);
    }
    *cg = sg;
    *cgx = sgx;
}

/* Backward of one example. Scratch: hs[0..k-1] (the h_i), hs[k], hs[k+1] (the gradient at y_i, in turn) and
   hs[k+2] (the sum of the dh_i, i >= 2, for k >= 3). With g the gradient at y_i:

       dh_i = r_i (g w_i - mean(g w_i) - xhat_i mean(g w_i xhat_i)),   the gradient at y_{i-1} (i > 1),
       ds = a dh_1 + sum_{i >= 2} dh_i,   dF = cf dh_1.

   Pass A recomputes the h_i and takes GN_k's channel sums; the pass of GN_i (i = k..1) writes dh_i and takes
   GN_{i-1}'s channel sums; the last writes ds and dF. */
static void backward_example(const job_t *t, int64_t ex, char **raw, REAL **hs, double *cg, double *cgx) {
    const int64_t c = t->c, hw = t->hw, m = c * hw, n = t->n, k = t->k;
    const REAL *s = t->s + ex * m, *f = t->f + ex * m, *dy = t->dy + ex * m;
    REAL *ds = t->ds + ex * m, *df = t->df + ex * m;
    uintptr_t taken[5 + MAX_K + 3];
    const REAL *ext[5] = {s, f, dy, ds, df};
    for (int i = 0; i < 5; i++) taken[i] = (uintptr_t)ext[i] % SLACK;
    for (int64_t i = 0; i < k + 3; i++) hs[i] = place(raw[i], taken, 5 + (int)i);
    const REAL a = (REAL)t->a, cf = (REAL)t->cf;
    const REAL *mean = t->mean, *rstd = t->rstd;
    for (int64_t ch = 0; ch < c; ch++) { /* pass A */
        const REAL *restrict sc = s + ch * hw, *restrict fc = f + ch * hw;
        REAL *restrict h0 = hs[0] + ch * hw;
#pragma omp simd
        for (int64_t j = 0; j < hw; j++) h0[j] = a * sc[j] + cf * fc[j];
        for (int64_t i = 1; i < k; i++) {
            const REAL mu = mean[(i - 1) * n + ex], r = rstd[(i - 1) * n + ex], wc = t->w[(i - 1) * c + ch];
            const REAL scale = r * wc, shift = t->b[(i - 1) * c + ch];
            const REAL *restrict prev = hs[i - 1] + ch * hw;
            REAL *restrict next = hs[i] + ch * hw;
#pragma omp simd
            for (int64_t j = 0; j < hw; j++) next[j] = (prev[j] - mu) * scale + shift + sc[j];
        }
        grad_sums(dy + ch * hw, hs[k - 1] + ch * hw, hw, mean[(k - 1) * n + ex], rstd[(k - 1) * n + ex],
                  cg + ch, cgx + ch);
    }
    const REAL *gin = dy;
    REAL *acc = hs[k + 2];
    for (int64_t i = k - 1; i >= 0; i--) {
        const REAL *w = t->w + i * c;
        const REAL mu = mean[i * n + ex], r = rstd[i * n + ex];
        double mg = 0.0, mgx = 0.0;
        for (int64_t ch = 0; ch < c; ch++) {
            t->dw[i * c + ch] += cgx[ch];
            t->db[i * c + ch] += cg[ch];
            mg += cg[ch] * w[ch];
            mgx += cgx[ch] * w[ch];
        }
        const REAL mgm = (REAL)(mg / (double)m), mgxm = (REAL)(mgx / (double)m);
        REAL *gout = gin == hs[k] ? hs[k + 1] : hs[k];
        for (int64_t ch = 0; ch < c; ch++) {
            const REAL wc = w[ch];
            const REAL *restrict gc = gin + ch * hw, *restrict hc = hs[i] + ch * hw;
            if (i > 0) {
                REAL *restrict go = gout + ch * hw;
#pragma omp simd
                for (int64_t j = 0; j < hw; j++) go[j] = r * (gc[j] * wc - mgm - (hc[j] - mu) * r * mgxm);
                if (i < k - 1) { /* the dh_i, i >= 2, summed for ds */
                    REAL *restrict ac = acc + ch * hw;
                    const REAL *restrict from = i == k - 2 ? gc : ac;
#pragma omp simd
                    for (int64_t j = 0; j < hw; j++) ac[j] = from[j] + go[j];
                }
                grad_sums(go, hs[i - 1] + ch * hw, hw, mean[(i - 1) * n + ex], rstd[(i - 1) * n + ex], cg + ch,
                          cgx + ch);
            } else {
                REAL *restrict dsc = ds + ch * hw, *restrict dfc = df + ch * hw;
                const REAL *restrict rest = k == 2 ? gc : acc + ch * hw; /* sum of dh_i, i >= 2 */
                if (k == 1) {
#pragma omp simd
                    for (int64_t j = 0; j < hw; j++) {
                        const REAL dh = r * (gc[j] * wc - mgm - (hc[j] - mu) * r * mgxm);
                        dsc[j] = a * dh;
                        dfc[j] = cf * dh;
                    }
                } else {
#pragma omp simd
                    for (int64_t j = 0; j < hw; j++) {
                        const REAL dh = r * (gc[j] * wc - mgm - (hc[j] - mu) * r * mgxm);
                        dsc[j] = rest[j] + a * dh;
                        dfc[j] = cf * dh;
                    }
                }
            }
        }
        gin = gout;
    }
}

static char *scratch(int64_t m) { /* room for m values at any 64-byte offset within a page */
    return aligned_alloc(64, ((size_t)m * sizeof(REAL) + SLACK + 63) / 64 * 64);
}

static void *forward_job(void *arg) {
    job_t *t = arg;
    char *raw = scratch(t->c * t->hw);
    if (!raw) { t->failed = 1; return NULL; }
    for (int64_t ex = t->n0; ex < t->n1; ex++) forward_example(t, ex, raw);
    free(raw);
    return NULL;
}

static void *backward_job(void *arg) {
    job_t *t = arg;
    char *raw[MAX_K + 3] = {0};
    REAL *bufs[MAX_K + 3];
    double *sums = malloc(sizeof(double) * 2 * t->c);
    int ok = sums != NULL;
    for (int64_t i = 0; i < t->k + 3; i++) ok = ok && (raw[i] = scratch(t->c * t->hw)) != NULL;
    for (int64_t ex = t->n0; ex < t->n1 && ok; ex++) backward_example(t, ex, raw, bufs, sums, sums + t->c);
    for (int64_t i = 0; i < t->k + 3; i++) free(raw[i]);
    free(sums);
    t->failed = !ok;
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
