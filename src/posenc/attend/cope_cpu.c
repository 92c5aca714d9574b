/* CoPE's row work for posenc's fused CPU attention (posenc/attend/cope_fused.py).
 *
 * The matrix products are torch's; this file does what lies between them, one query row
 * at a time, in place. Per block of query rows: S [rows, n] the scaled logits q.k * scale
 * of the keys, F [rows, fcols] the table logits F[c] = q . E[c] of the positions the block
 * reaches, P [rows, n] positions.
 *
 *   positions  S -> P (p_j), and each row's largest position (which F columns are needed);
 *   forward    S, F, P -> S := the attention probabilities, and the row's log-sum-exp;
 *   backward   S, F, dP (the gradient of the probabilities) -> S := dS (of the scaled
 *              logits), dP := the probabilities, dF (of the table logits).
 *
 * For a row, the keys it may attend are j < n_row (the causal limit) with mask[j] != 0;
 * g_j = sigmoid(S_j) on them (0 elsewhere), p_j = min(sum_{t >= j} g_t, npos - 1) summed
 * in double, z_j = F[lo] + w (F[hi] - F[lo]) with lo = floor p, hi = min(lo + 1, npos - 1),
 * w = p - lo, and the logit S_j + a z_j (a = scale or 1). A row with no key gives P = 0
 * (its output 0) and no gradient. NaN in gives NaN out.
 *
 * Each function exists for float (suffix _f32) and double (_f64). The float exponential is a
 * polynomial the compiler vectorises (relative error below 2 ulp; fused multiply-adds where
 * the CPU has them); double uses libm. The sums over keys and the float interpolation are
 * written with GCC's vector extensions (clang has them too), which the compiler lowers to
 * the CPU's vectors or to scalar code: no intrinsics, the same source on every machine.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* Floating-point exceptions are never read here; without this GCC will not vectorise the
 * float -> int conversion of the positions (it might raise one). */
#pragma GCC optimize("no-trapping-math")
#endif
#include <math.h>
#include <stdint.h>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
/* Subnormals flushed to zero in these loops (and the mode put back after): a weight of
 * e^-87 times a small gradient is one, and x86 computes on them about 100x slower. */
#define FTZ_ON unsigned int csr_saved = _mm_getcsr(); _mm_setcsr(csr_saved | 0x8040);
#define FTZ_OFF _mm_setcsr(csr_saved);
#else
#define FTZ_ON
#define FTZ_OFF
#endif
#include <stdlib.h>
#include <string.h>

#if defined(__FMA__)
#define MADD(x, y, z) __builtin_fmaf(x, y, z) /* one rounding, one instruction */
#else
#define MADD(x, y, z) ((x) * (y) + (z))
#endif

static inline float exp_f32(float x) {
    /* e^x = 2^n e^r, |r| <= ln2 / 2; NaN stays NaN (the comparisons keep it). */
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = MADD(n, -0.693359375f, x);
    r = MADD(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = MADD(p, r, 1.3981999507e-3f);
    p = MADD(p, r, 8.3334519073e-3f);
    p = MADD(p, r, 4.1665795894e-2f);
    p = MADD(p, r, 1.6666665459e-1f);
    p = MADD(p, r, 5.0000001201e-1f);
    p = MADD(p * r, r, r) + 1.0f;
    union {
        int32_t i;
        float f;
    } two;
    two.i = ((int32_t)n + 127) << 23;
    return p * two.f;
}

static inline double exp_f64(double x) { return exp(x); }

typedef struct {
    int64_t rows;       /* B * R rows, B = b * h */
    int64_t R;          /* rows per (batch, head) */
    int64_t H;          /* heads (to split B into b, h for the mask) */
    int64_t n;          /* keys per row */
    int64_t npos;       /* table rows (positions 0 .. npos - 1) */
    int64_t first;      /* row r sees keys j <= first + r; < 0: no causal limit */
    int64_t mb, mh, mr; /* mask strides (bytes) of batch, head and row; mask NULL: all */
    int64_t fcols;      /* table logits per row (> the largest position the row reaches) */
    int64_t threads;
} cope_shape;

static inline int64_t row_keys(const cope_shape *c, int64_t r) {
    if (c->first < 0) return c->n;
    int64_t lim = c->first + r + 1;
    return lim < c->n ? lim : c->n;
}

static inline const uint8_t *row_mask(const cope_shape *c, const uint8_t *mask, int64_t row) {
    if (mask == NULL) return NULL;
    int64_t bh = row / c->R, r = row % c->R;
    return mask + (bh / c->H) * c->mb + (bh % c->H) * c->mh + r * c->mr;
}

/* Eight keys a step in the loops below, written with GCC's vector extensions (clang's too):
 * the compiler lowers them to the machine's vectors (AVX2, SSE2, NEON) or to scalar code. */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#if defined(__clang__)
#define SHUF4(x, y, i0, i1, i2, i3) __builtin_shufflevector(x, y, i0, i1, i2, i3)
#else
#define SHUF4(x, y, i0, i1, i2, i3) __builtin_shuffle(x, y, (v4l){i0, i1, i2, i3})
#endif
#define BCAST4(x, i) SHUF4(x, x, i, i, i, i)

static inline v4d vprefix(v4d x) { /* [x0, x0 + x1, x0 + x1 + x2, x0 + .. + x3] */
    const v4d z = {0, 0, 0, 0};
    x += SHUF4(x, z, 4, 0, 1, 2);
    return x + SHUF4(x, z, 4, 4, 0, 1);
}

static inline v4d vsuffix(v4d x) { /* [x0 + .. + x3, x1 + x2 + x3, x2 + x3, x3] */
    const v4d z = {0, 0, 0, 0};
    x += SHUF4(x, z, 1, 2, 3, 4);
    return x + SHUF4(x, z, 2, 3, 4, 4);
}

static inline v4d load4_f32(const float *x) {
    v4f v;
    memcpy(&v, x, sizeof v);
    return __builtin_convertvector(v, v4d);
}

static inline v4d load4_f64(const double *x) {
    v4d v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* Store the sums rounded to the type, clamped to top when clamp (NaN stays NaN). */
static inline void store4_f32(float *x, v4d v, int clamp, float top) {
    v4f f = __builtin_convertvector(v, v4f);
    if (clamp) {
        v4f t = {top, top, top, top};
        v4i m = f > t;
        f = (v4f)(((v4i)f & ~m) | ((v4i)t & m));
    }
    memcpy(x, &f, sizeof f);
}

static inline void store4_f64(double *x, v4d v, int clamp, double top) {
    if (clamp) {
        v4d t = {top, top, top, top};
        v4l m = v > t;
        v = (v4d)(((v4l)v & ~m) | ((v4l)t & m));
    }
    memcpy(x, &v, sizeof v);
}

/* prefix: out[j] = sum_{t <= j} x[t]; suffix: out[j] = min(sum_{t >= j} x[t], top). Summed
 * in double, eight keys a step: each half's sums within its four lanes, then the carry of
 * the keys before (after) it, so only the carry's one addition waits on the step before.
 * In place is fine. */
#define DEFINE_SCANS(T, SUF)                                                                  \
    static void prefix_##SUF(const T *x, T *out, int64_t n) {                                 \
        v4d carry = {0, 0, 0, 0};                                                             \
        int64_t j = 0;                                                                        \
        for (; j + 8 <= n; j += 8) {                                                          \
            v4d lo = vprefix(load4_##SUF(x + j));                                             \
            v4d hi = vprefix(load4_##SUF(x + j + 4)) + BCAST4(lo, 3);                         \
            store4_##SUF(out + j, lo + carry, 0, 0);                                          \
            store4_##SUF(out + j + 4, hi + carry, 0, 0);                                      \
            carry += BCAST4(hi, 3);                                                           \
        }                                                                                     \
        double acc = carry[0];                                                                \
        for (; j < n; j++) {                                                                  \
            acc += x[j];                                                                      \
            out[j] = (T)acc;                                                                  \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    static void suffix_##SUF(const T *x, T *out, int64_t n, T top) {                          \
        v4d carry = {0, 0, 0, 0};                                                             \
        int64_t j = n;                                                                        \
        for (; j >= 8; j -= 8) {                                                              \
            v4d hi = vsuffix(load4_##SUF(x + j - 4));                                         \
            v4d lo = vsuffix(load4_##SUF(x + j - 8)) + BCAST4(hi, 0);                         \
            store4_##SUF(out + j - 4, hi + carry, 1, top);                                    \
            store4_##SUF(out + j - 8, lo + carry, 1, top);                                    \
            carry += BCAST4(lo, 0);                                                           \
        }                                                                                     \
        double acc = carry[0];                                                                \
        for (j = j - 1; j >= 0; j--) {                                                        \
            acc += x[j];                                                                      \
            T p = (T)acc;                                                                     \
            out[j] = p > top ? top : p; /* NaN stays NaN */                                   \
        }                                                                                     \
    }

DEFINE_SCANS(float, f32)
DEFINE_SCANS(double, f64)

static inline int32_t or8(v8i x) { /* the bitwise or of the eight lanes */
#if defined(__clang__)
    x |= __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
    x |= __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5);
    x |= __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6);
#else
    x |= __builtin_shuffle(x, (v8i){4, 5, 6, 7, 0, 1, 2, 3});
    x |= __builtin_shuffle(x, (v8i){2, 3, 0, 1, 6, 7, 4, 5});
    x |= __builtin_shuffle(x, (v8i){1, 0, 3, 2, 5, 4, 7, 6});
#endif
    return x[0];
}

/* Keys j .. j + 7 (pos[0 .. 7]): lo = floor(p), w = p - lo and the table logits F[lo] and
 * F[lo + 1] - F[lo] from two loads and two permutes, where the eight lo lie within eight
 * positions of each other, at least eight columns below the block's last (a row's p falls
 * by at most one a key: nearly every group). Returns 0, writing nothing, otherwise (a NaN,
 * the clamp, a row's last columns): the caller takes the per-key loop. The gathers that
 * loop compiles to were most of the time of the passes that use it. */
static inline int interp8_f32(const float *restrict pos, const float *restrict f, int32_t cap,
                              int32_t *restrict lo, float *restrict w, float *restrict flo,
                              float *restrict dj) {
    v8f p, fl;
    memcpy(&p, pos, sizeof p);
    const float most = (float)(cap - 8);
    v8i inside = (p >= (v8f){0, 0, 0, 0, 0, 0, 0, 0}) & (p <= (v8f){most, most, most, most,
                                                                   most, most, most, most});
    p = (v8f)((v8i)p & inside); /* NaN fails both comparisons: 0, converted safely */
    for (int k = 0; k < 8; k++) fl[k] = floorf(p[k]);
    v8i li = __builtin_convertvector(fl, v8i);
    int32_t base = li[7];
    v8i idx = li - base; /* p falls with j: lane 7 is the smallest */
    /* a lane outside, lo out of reach; base + 8 <= cap also where cap - 8 rounded up */
    if ((uint32_t)or8(idx | ~inside) > 7u || base + 8 > cap) return 0;
    v8f f0, f1, a0, a1;
    memcpy(&f0, f + base, sizeof f0);
    memcpy(&f1, f + base + 1, sizeof f1);
#if defined(__clang__)
    for (int k = 0; k < 8; k++) {
        a0[k] = f0[idx[k]];
        a1[k] = f1[idx[k]];
    }
#else
    a0 = __builtin_shuffle(f0, idx);
    a1 = __builtin_shuffle(f1, idx);
#endif
    v8f wv = p - fl, dv = a1 - a0;
    memcpy(lo, &li, sizeof li);
    memcpy(w, &wv, sizeof wv);
    memcpy(flo, &a0, sizeof a0);
    memcpy(dj, &dv, sizeof dv);
    return 1;
}

static inline int interp8_f64(const double *restrict pos, const double *restrict f,
                              int32_t cap, int32_t *restrict lo, double *restrict w,
                              double *restrict flo, double *restrict dj) {
    (void)pos, (void)f, (void)cap, (void)lo, (void)w, (void)flo, (void)dj;
    return 0; /* float64 (the oracle's precision, for tests) keeps the per-key loop */
}

#define DEFINE_COPE(T, SUF, EXP, FLOOR)                                                       \
    static void gates_##SUF(const T *s, const uint8_t *m, int64_t nr, T *g) {                 \
        if (m == NULL) {                                                                      \
            for (int64_t j = 0; j < nr; j++) g[j] = (T)1 / ((T)1 + EXP(-s[j]));               \
        } else {                                                                              \
            for (int64_t j = 0; j < nr; j++)                                                  \
                g[j] = m[j] ? (T)1 / ((T)1 + EXP(-s[j])) : (T)0;                              \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* Per key j: lo = floor(p_j) (clamped to the block's columns), w = p_j - lo, F[lo] and   \
     * F[hi] - F[lo] (hi = lo + 1, clamped), eight keys at a time where they allow it. */     \
    static void interp_##SUF(const cope_shape *c, const T *restrict pos, int64_t nr,          \
                             const T *restrict f, int32_t *restrict lo, T *restrict w,        \
                             T *restrict flo, T *restrict dj) {                               \
        const int32_t last = (int32_t)(c->npos - 1), cap = (int32_t)(c->fcols - 1);           \
        int64_t j = 0;                                                                        \
        while (j < nr) {                                                                      \
            int fast = j + 8 <= nr;                                                           \
            if (fast && interp8_##SUF(pos + j, f, cap, lo + j, w + j, flo + j, dj + j)) {     \
                j += 8;                                                                       \
                continue;                                                                     \
            }                                                                                 \
            for (int64_t stop = j + 8 < nr ? j + 8 : nr; j < stop; j++) {                     \
                T p = pos[j];                                                                 \
                T fl = FLOOR(p);                                                              \
                int32_t li = (p == p) ? (int32_t)fl : 0;                                      \
                li = li < cap ? li : cap; /* never past the block's table logits */           \
                int32_t hi = li < last ? li + 1 : li;                                         \
                hi = hi < cap ? hi : cap;                                                     \
                lo[j] = li;                                                                   \
                w[j] = p - fl;                                                                \
                flo[j] = f[li];                                                               \
                dj[j] = f[hi] - f[li];                                                        \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* The logits with the position term, in place in s (-inf where masked). Returns the      \
     * row's max (NaN sticks). tmp: room for n int32 and 3 n T. */                            \
    static T logits_##SUF(const cope_shape *c, T *restrict s, const T *restrict f,            \
                          const uint8_t *m, int64_t nr, T a, const T *restrict pos,           \
                          void *tmp) {                                                        \
        T *w = (T *)tmp, *flo = w + c->n, *dj = flo + c->n;                                   \
        int32_t *lo = (int32_t *)(dj + c->n);                                                 \
        interp_##SUF(c, pos, nr, f, lo, w, flo, dj);                                          \
        for (int64_t j = 0; j < nr; j++) s[j] = s[j] + a * (flo[j] + w[j] * dj[j]);           \
        if (m != NULL) {                                                                      \
            for (int64_t j = 0; j < nr; j++) s[j] = m[j] ? s[j] : -(T)INFINITY;               \
        }                                                                                     \
        T lane[8];                                                                            \
        for (int k = 0; k < 8; k++) lane[k] = -(T)INFINITY;                                   \
        int nan = 0;                                                                          \
        int64_t j8 = nr - nr % 8;                                                             \
        for (int64_t j = 0; j < j8; j += 8)                                                   \
            for (int k = 0; k < 8; k++) {                                                     \
                lane[k] = s[j + k] > lane[k] ? s[j + k] : lane[k];                            \
                nan |= s[j + k] != s[j + k];                                                  \
            }                                                                                 \
        for (int64_t j = j8; j < nr; j++) {                                                   \
            lane[0] = s[j] > lane[0] ? s[j] : lane[0];                                        \
            nan |= s[j] != s[j];                                                              \
        }                                                                                     \
        T best = lane[0];                                                                     \
        for (int k = 1; k < 8; k++) best = lane[k] > best ? lane[k] : best;                   \
        return nan ? (T)NAN : best;                                                           \
    }                                                                                         \
                                                                                              \
    static void fwd_row_##SUF(const cope_shape *c, T *s, const T *f, const T *pos,            \
                              const uint8_t *m, int64_t nr, T a, T *lse, void *tmp) {         \
        T best = logits_##SUF(c, s, f, m, nr, a, pos, tmp);                                   \
        if (best == -(T)INFINITY) { /* no key: output 0 */                                    \
            memset(s, 0, sizeof(T) * c->n);                                                   \
            *lse = -(T)INFINITY;                                                              \
            return;                                                                           \
        }                                                                                     \
        /* the exponentials and their sum in one pass */                                      \
        T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                 \
        int64_t j8 = nr - nr % 8;                                                             \
        if (m == NULL) {                                                                      \
            for (int64_t j = 0; j < j8; j += 8)                                               \
                for (int k = 0; k < 8; k++) {                                                 \
                    T e = EXP(s[j + k] - best);                                               \
                    s[j + k] = e;                                                             \
                    part[k] += e;                                                             \
                }                                                                             \
        } else { /* masked: 0 (exp(-inf) is not) */                                           \
            for (int64_t j = 0; j < j8; j += 8)                                               \
                for (int k = 0; k < 8; k++) {                                                 \
                    T e = m[j + k] ? EXP(s[j + k] - best) : (T)0;                             \
                    s[j + k] = e;                                                             \
                    part[k] += e;                                                             \
                }                                                                             \
        }                                                                                     \
        for (int64_t j = j8; j < nr; j++) {                                                   \
            T e = (m == NULL || m[j]) ? EXP(s[j] - best) : (T)0;                              \
            s[j] = e;                                                                         \
            part[0] += e;                                                                     \
        }                                                                                     \
        for (int k = 0; k < 4; k++) part[k] += part[k + 4];                                   \
        T sum = (part[0] + part[1]) + (part[2] + part[3]);                                    \
        T inv = (T)1 / sum;                                                                   \
        for (int64_t j = 0; j < nr; j++) s[j] *= inv;                                         \
        if (nr < c->n) memset(s + nr, 0, sizeof(T) * (c->n - nr));                            \
        *lse = best + (T)log((double)sum);                                                    \
    }                                                                                         \
                                                                                              \
    /* df[c] = sum over the keys j with lo_j = c of dz_j (1 - w_j), plus over those with      \
     * hi_j = c of dz_j w_j (dz_j = a dL_j). lo_j never rises with j (p_j is a suffix sum of  \
     * gates), so each position's keys are one run: the run ends come from one scatter        \
     * (endj[lo_j] = j, the last write wins) and each run's sums are differences of float64   \
     * prefix sums; no loop carries a sum through memory. */                                  \
    static void table_grad_##SUF(const cope_shape *c, const int32_t *restrict lo,             \
                                 int64_t nr, T *restrict df, T *restrict sv,                  \
                                 double *restrict pu, double *restrict pv,                    \
                                 int32_t *restrict endj) {                                    \
        const int32_t last = (int32_t)(c->npos - 1);                                          \
        memset(endj, 0xff, sizeof(int32_t) * c->fcols); /* -1: no key at c */                 \
        memset(df, 0, sizeof(T) * c->fcols);                                                  \
        if (nr == 0) return;                                                                  \
        for (int64_t j = 0; j < nr; j++) endj[lo[j]] = (int32_t)j;                            \
        int32_t top = 0, bottom = last;                                                       \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            top = lo[j] > top ? lo[j] : top;                                                  \
            bottom = lo[j] < bottom ? lo[j] : bottom;                                         \
        }                                                                                     \
        pu[0] = pv[0] = 0.0; /* pu[j + 1], pv[j + 1]: key j's parts, summed here */           \
        prefix_f64(pu + 1, pu + 1, nr);                                                       \
        prefix_f64(pv + 1, pv + 1, nr);                                                       \
        int32_t prev = -1;                                                                    \
        for (int32_t p = top; p >= bottom; p--) {                                             \
            int32_t e = endj[p] < 0 ? prev : endj[p];                                         \
            df[p] = (T)(pu[e + 1] - pu[prev + 1]);                                            \
            sv[p] = (T)(pv[e + 1] - pv[prev + 1]);                                            \
            prev = e;                                                                         \
        }                                                                                     \
        const int32_t cap = (int32_t)(c->fcols - 1);                                          \
        int32_t upto = top < cap ? top : cap - 1; /* below it hi = p + 1: one vector loop */  \
        for (int32_t p = bottom; p <= upto; p++) df[p + 1] += sv[p];                          \
        for (int32_t p = upto + 1 > bottom ? upto + 1 : bottom; p <= top; p++) {              \
            int32_t hi = p < last ? p + 1 : p;                                                \
            df[hi < cap ? hi : cap] += sv[p];                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* The interpolation at p_j (interp), then one pass over the row's keys: the logit,       \
     * its probability exp(L - lse), the logit's gradient dL = P (dP - delta) (in s; P in     \
     * dp), the position's gradient dz (F[hi] - F[lo]) with dz = a dL (in pos), and the two   \
     * parts of dz, dz (1 - w) and dz w, in float64 for their prefix sums. */                 \
    static void grads_##SUF(const cope_shape *c, T *restrict s, T *restrict dp,               \
                            const T *restrict f, int64_t nr, T a, T lse, T delta,             \
                            T *restrict pos, int32_t *restrict lo, T *restrict w,             \
                            T *restrict flo, T *restrict dj, double *restrict pu,             \
                            double *restrict pv) {                                            \
        interp_##SUF(c, pos, nr, f, lo, w, flo, dj);                                          \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            T prob = EXP(s[j] + a * (flo[j] + w[j] * dj[j]) - lse);                           \
            T dl = prob * (dp[j] - delta);                                                    \
            T dz = a * dl;                                                                    \
            dp[j] = prob;                                                                     \
            s[j] = dl;                                                                        \
            pos[j] = dz * dj[j];                                                              \
        }                                                                                     \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            double dzd = (double)(a * s[j]), part = dzd * (double)w[j];                       \
            pu[j + 1] = dzd - part;                                                           \
            pv[j + 1] = part;                                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    static void bwd_row_##SUF(const cope_shape *c, T *s, T *dp, const T *f, T *df,            \
                              const uint8_t *m, int64_t nr, T a, T lse, T delta, T *g,        \
                              T *pos, int32_t *lo, T *w, T *flo, T *dj, T *sv, double *pu,    \
                              double *pv, int32_t *endj) {                                    \
        if (lse == -(T)INFINITY) { /* no key: no gradient */                                  \
            memset(s, 0, sizeof(T) * c->n);                                                   \
            memset(dp, 0, sizeof(T) * c->n);                                                  \
            memset(df, 0, sizeof(T) * c->fcols);                                              \
            return;                                                                           \
        }                                                                                     \
        gates_##SUF(s, m, nr, g);                                                             \
        suffix_##SUF(g, pos, nr, (T)(c->npos - 1));                                           \
        grads_##SUF(c, s, dp, f, nr, a, lse, delta, pos, lo, w, flo, dj, pu, pv);             \
        if (m != NULL) { /* a masked key: no probability, no gradient */                      \
            for (int64_t j = 0; j < nr; j++) {                                                \
                if (!m[j]) {                                                                  \
                    dp[j] = s[j] = pos[j] = (T)0;                                             \
                    pu[j + 1] = pv[j + 1] = 0.0;                                              \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        table_grad_##SUF(c, lo, nr, df, sv, pu, pv, endj);                                    \
        prefix_##SUF(pos, pos, nr); /* g_j's gradient: the sum over t <= j */                 \
        for (int64_t j = 0; j < nr; j++) s[j] += pos[j] * (g[j] * ((T)1 - g[j]));             \
        if (nr < c->n) {                                                                      \
            memset(s + nr, 0, sizeof(T) * (c->n - nr));                                       \
            memset(dp + nr, 0, sizeof(T) * (c->n - nr));                                      \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* The entry points: every thread of the team takes its share of the rows (an OpenMP      \
     * loop must be met by all of them); one whose buffers could not be allocated does none   \
     * of its rows and the call returns 1. */                                                 \
    int posenc_cope_positions_##SUF(const cope_shape *c, const T *s, T *pos,                  \
                                    const uint8_t *mask, T *top) {                            \
        int failed = 0;                                                                       \
        _Pragma("omp parallel num_threads(c->threads) reduction(|:failed)") {                 \
            FTZ_ON                                                                            \
            T *g = (T *)malloc(sizeof(T) * (c->n > 0 ? c->n : 1));                            \
            failed |= g == NULL;                                                              \
            _Pragma("omp for schedule(dynamic, 4)") for (int64_t row = 0; row < c->rows;      \
                                                         row++) {                             \
                if (g == NULL) continue;                                                      \
                int64_t nr = row_keys(c, row % c->R);                                         \
                T *p = pos + row * c->n;                                                      \
                gates_##SUF(s + row * c->n, row_mask(c, mask, row), nr, g);                   \
                suffix_##SUF(g, p, nr, (T)(c->npos - 1));                                     \
                top[row] = nr > 0 ? p[0] : (T)0; /* the largest: p falls with j */            \
            }                                                                                 \
            free(g);                                                                          \
            FTZ_OFF                                                                           \
        }                                                                                     \
        return failed;                                                                        \
    }                                                                                         \
                                                                                              \
    int posenc_cope_forward_##SUF(const cope_shape *c, T *s, const T *f, const T *pos,        \
                                  const uint8_t *mask, T *lse, double a) {                    \
        int failed = 0;                                                                       \
        _Pragma("omp parallel num_threads(c->threads) reduction(|:failed)") {                 \
            FTZ_ON                                                                            \
            void *tmp = malloc((3 * sizeof(T) + sizeof(int32_t)) * (c->n > 0 ? c->n : 1));    \
            failed |= tmp == NULL;                                                            \
            _Pragma("omp for schedule(dynamic, 4)") for (int64_t row = 0; row < c->rows;      \
                                                         row++) {                             \
                if (tmp == NULL) continue;                                                    \
                fwd_row_##SUF(c, s + row * c->n, f + row * c->fcols, pos + row * c->n,        \
                              row_mask(c, mask, row), row_keys(c, row % c->R), (T)a,          \
                              lse + row, tmp);                                                \
            }                                                                                 \
            free(tmp);                                                                        \
            FTZ_OFF                                                                           \
        }                                                                                     \
        return failed;                                                                        \
    }                                                                                         \
                                                                                              \
    int posenc_cope_backward_##SUF(const cope_shape *c, T *s, T *dp, const T *f, T *df,       \
                                   const uint8_t *mask, const T *lse, const T *delta,         \
                                   double a) {                                                \
        int failed = 0;                                                                       \
        _Pragma("omp parallel num_threads(c->threads) reduction(|:failed)") {                 \
            FTZ_ON                                                                            \
            int64_t n1 = c->n > 0 ? c->n : 1;                                                 \
            size_t bytes = sizeof(double) * 2 * (n1 + 1) + sizeof(T) * (5 * n1 + c->fcols)    \
                           + sizeof(int32_t) * (n1 + c->fcols);                               \
            char *mem = (char *)malloc(bytes);                                                \
            failed |= mem == NULL;                                                            \
            double *pu = (double *)mem, *pv = pu + n1 + 1;                                    \
            T *g = (T *)(pv + n1 + 1), *pos = g + n1, *w = pos + n1, *flo = w + n1;           \
            T *dj = flo + n1, *sv = dj + n1;                                                  \
            int32_t *lo = (int32_t *)(sv + c->fcols), *endj = lo + n1;                        \
            _Pragma("omp for schedule(dynamic, 4)") for (int64_t row = 0; row < c->rows;      \
                                                         row++) {                             \
                if (mem == NULL) continue;                                                    \
                bwd_row_##SUF(c, s + row * c->n, dp + row * c->n, f + row * c->fcols,         \
                              df + row * c->fcols, row_mask(c, mask, row),                    \
                              row_keys(c, row % c->R), (T)a, lse[row], delta[row], g, pos,    \
                              lo, w, flo, dj, sv, pu, pv, endj);                              \
            }                                                                                 \
            free(mem);                                                                        \
            FTZ_OFF                                                                           \
        }                                                                                     \
        return failed;                                                                        \
    }

DEFINE_COPE(float, f32, exp_f32, floorf)
DEFINE_COPE(double, f64, exp_f64, floor)
