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
 * polynomial the compiler vectorises (relative error below 2 ulp); double uses libm.
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

static inline float exp_f32(float x) {
    /* e^x = 2^n e^r, |r| <= ln2 / 2; NaN stays NaN (the comparisons keep it). */
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
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

/* x[j] := sum_{t <= j} x[t] in place: four segments as four interleaved chains, then each
 * segment's carry added (a loop of one chain waits on every addition). */
static void prefix_d(double *x, int64_t n) {
    int64_t q4 = n / 4;
    double acc[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < q4; i++)
        for (int k = 0; k < 4; k++) {
            acc[k] += x[k * q4 + i];
            x[k * q4 + i] = acc[k];
        }
    for (int64_t j = 4 * q4; j < n; j++) {
        acc[3] += x[j];
        x[j] = acc[3];
    }
    double carry = 0.0;
    for (int k = 0; k < 4; k++) {
        int64_t lo = k * q4, hi = k == 3 ? n : lo + q4;
        if (carry != 0.0)
            for (int64_t j = lo; j < hi; j++) x[j] += carry;
        carry += acc[k];
    }
}

#define DEFINE_COPE(T, SUF, EXP, FLOOR)                                                       \
    /* out[j] = min(sum_{t >= j} g[t], top) (dir < 0) or sum_{t <= j} g[t] (dir > 0, no      \
     * clamp): four segments scanned as four interleaved chains of double additions, then    \
     * each segment's carry (the sums of the segments beyond it) added. In place is fine. */ \
    static void scan_##SUF(const T *g, T *out, int64_t nr, int dir, T top) {                 \
        int64_t q4 = nr / 4, extra = nr - 4 * q4;                                             \
        double acc[4] = {0, 0, 0, 0};                                                         \
        if (dir < 0) {                                                                        \
            for (int64_t j = nr - 1; j >= 4 * q4; j--) { /* the last segment's extra keys */  \
                acc[3] += g[j];                                                               \
                out[j] = (T)acc[3];                                                           \
            }                                                                                 \
            for (int64_t i = q4 - 1; i >= 0; i--)                                             \
                for (int k = 0; k < 4; k++) {                                                 \
                    acc[k] += g[k * q4 + i];                                                  \
                    out[k * q4 + i] = (T)acc[k];                                              \
                }                                                                             \
        } else {                                                                              \
            for (int64_t i = 0; i < q4; i++)                                                  \
                for (int k = 0; k < 4; k++) {                                                 \
                    acc[k] += g[k * q4 + i];                                                  \
                    out[k * q4 + i] = (T)acc[k];                                              \
                }                                                                             \
            for (int64_t j = 4 * q4; j < nr; j++) {                                           \
                acc[3] += g[j];                                                               \
                out[j] = (T)acc[3];                                                           \
            }                                                                                 \
        }                                                                                     \
        (void)extra;                                                                          \
        double carry = 0.0; /* then the carries, and (dir < 0) the clamp, in one pass */   \
        for (int k = dir < 0 ? 3 : 0; dir < 0 ? k >= 0 : k < 4; k += dir) {                   \
            int64_t lo = k * q4, hi = k == 3 ? nr : lo + q4;                                  \
            if (dir < 0) {                                                                    \
                for (int64_t j = lo; j < hi; j++) {                                           \
                    T p = (T)((double)out[j] + carry);                                        \
                    out[j] = p > top ? top : p; /* NaN stays NaN */                          \
                }                                                                             \
            } else if (carry != 0.0) {                                                        \
                for (int64_t j = lo; j < hi; j++) out[j] = (T)((double)out[j] + carry);       \
            }                                                                                 \
            carry += acc[k];                                                                  \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    static void gates_##SUF(const T *s, const uint8_t *m, int64_t nr, T *g) {                \
        if (m == NULL) {                                                                      \
            for (int64_t j = 0; j < nr; j++) g[j] = (T)1 / ((T)1 + EXP(-s[j]));               \
        } else {                                                                              \
            for (int64_t j = 0; j < nr; j++)                                                  \
                g[j] = m[j] ? (T)1 / ((T)1 + EXP(-s[j])) : (T)0;                              \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* The logits with the position term, in place in s (-inf where masked). Returns the    \
     * row's max (NaN sticks). */                                                             \
    static T logits_##SUF(const cope_shape *c, T *restrict s, const T *restrict f,          \
                          const uint8_t *m, int64_t nr, T a, const T *restrict pos) {         \
        const int32_t last = (int32_t)(c->npos - 1), cap = (int32_t)(c->fcols - 1);           \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            T p = pos[j];                                                                     \
            T fl = FLOOR(p);                                                                  \
            int32_t li = (p == p) ? (int32_t)fl : 0;                                          \
            li = li < cap ? li : cap; /* never past the block's table logits */              \
            int32_t hi = li < last ? li + 1 : li;                                             \
            hi = hi < cap ? hi : cap;                                                         \
            T flo = f[li];                                                                    \
            s[j] = s[j] + a * (flo + (p - fl) * (f[hi] - flo));                               \
        }                                                                                     \
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
    static void fwd_row_##SUF(const cope_shape *c, T *s, const T *f, const T *pos,         \
                              const uint8_t *m, int64_t nr, T a, T *lse) {                    \
        T best = logits_##SUF(c, s, f, m, nr, a, pos);                                        \
        if (best == -(T)INFINITY) { /* no key: output 0 */                                   \
            memset(s, 0, sizeof(T) * c->n);                                                   \
            *lse = -(T)INFINITY;                                                              \
            return;                                                                           \
        }                                                                                     \
        for (int64_t j = 0; j < nr; j++) s[j] = EXP(s[j] - best); /* exp(-inf) is not 0 */  \
        if (m != NULL) {                                                                      \
            for (int64_t j = 0; j < nr; j++) s[j] = m[j] ? s[j] : (T)0;                       \
        }                                                                                     \
        T part[4] = {0, 0, 0, 0};                                                             \
        int64_t j4 = nr - nr % 4;                                                             \
        for (int64_t j = 0; j < j4; j += 4) {                                                 \
            part[0] += s[j];                                                                  \
            part[1] += s[j + 1];                                                              \
            part[2] += s[j + 2];                                                              \
            part[3] += s[j + 3];                                                              \
        }                                                                                     \
        for (int64_t j = j4; j < nr; j++) part[0] += s[j];                                    \
        T sum = (part[0] + part[1]) + (part[2] + part[3]);                                    \
        T inv = (T)1 / sum;                                                                   \
        for (int64_t j = 0; j < nr; j++) s[j] *= inv;                                         \
        if (nr < c->n) memset(s + nr, 0, sizeof(T) * (c->n - nr));                            \
        *lse = best + (T)log((double)sum);                                                    \
    }                                                                                         \
                                                                                              \
    /* df[c] = sum over the keys j with lo_j = c of dz_j (1 - w_j), plus over those with     \
     * hi_j = c of dz_j w_j (dz_j = a dL_j). lo_j never rises with j (p_j is a suffix sum of  \
     * gates), so each position's keys are one run: the run ends come from one scatter       \
     * (endj[lo_j] = j, the last write wins) and each run's sums are differences of float64 \
     * prefix sums; no loop carries a sum through memory. */                                 \
    static void table_grad_##SUF(const cope_shape *c, const int32_t *lo, int64_t nr, T *df, \
                                 T *sv, double *pu, double *pv, int32_t *endj) {              \
        const int32_t last = (int32_t)(c->npos - 1);                                          \
        memset(endj, 0xff, sizeof(int32_t) * c->fcols); /* -1: no key at c */               \
        memset(df, 0, sizeof(T) * c->fcols);                                                  \
        if (nr == 0) return;                                                                  \
        for (int64_t j = 0; j < nr; j++) endj[lo[j]] = (int32_t)j;                            \
        int32_t top = 0, bottom = last;                                                       \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            top = lo[j] > top ? lo[j] : top;                                                  \
            bottom = lo[j] < bottom ? lo[j] : bottom;                                         \
        }                                                                                     \
        pu[0] = pv[0] = 0.0; /* pu[j + 1], pv[j + 1]: key j's parts, summed here */          \
        prefix_d(pu + 1, nr);                                                                 \
        prefix_d(pv + 1, nr);                                                                 \
        int32_t prev = -1;                                                                    \
        for (int32_t p = top; p >= bottom; p--) {                                             \
            int32_t e = endj[p] < 0 ? prev : endj[p];                                         \
            df[p] = (T)(pu[e + 1] - pu[prev + 1]);                                            \
            sv[p] = (T)(pv[e + 1] - pv[prev + 1]);                                            \
            prev = e;                                                                         \
        }                                                                                     \
        for (int32_t p = bottom; p <= top; p++) {                                             \
            int32_t hi = p < last ? p + 1 : p;                                                \
            hi = hi < c->fcols ? hi : (int32_t)(c->fcols - 1);                                \
            df[hi] += sv[p];                                                                  \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* One pass over the row's keys: the interpolation at p_j, the logit, its probability  \
     * exp(L - lse), the logit's gradient dL = P (dP - delta) (in s; P in dp), the position's \
     * gradient dz (F[hi] - F[lo]) with dz = a dL (in pos), lo (for the table's gradient) and \
     * the two parts of dz, dz (1 - w) and dz w, in float64 for their prefix sums. */        \
    static void grads_##SUF(const cope_shape *c, T *restrict s, T *restrict dp,             \
                            const T *restrict f, int64_t nr, T a, T lse, T delta,             \
                            T *restrict pos, int32_t *restrict lo, T *restrict w,             \
                            double *restrict pu, double *restrict pv) {                       \
        const int32_t last = (int32_t)(c->npos - 1), cap = (int32_t)(c->fcols - 1);           \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            T p = pos[j];                                                                     \
            T fl = FLOOR(p);                                                                  \
            int32_t li = (p == p) ? (int32_t)fl : 0;                                          \
            li = li < cap ? li : cap;                                                         \
            int32_t hi = li < last ? li + 1 : li;                                             \
            hi = hi < cap ? hi : cap;                                                         \
            T flo = f[li], dj = f[hi] - flo, wj = p - fl;                                     \
            T prob = EXP(s[j] + a * (flo + wj * dj) - lse);                                   \
            T dl = prob * (dp[j] - delta);                                                    \
            T dz = a * dl;                                                                    \
            dp[j] = prob;                                                                     \
            s[j] = dl;                                                                        \
            pos[j] = dz * dj;                                                                 \
            lo[j] = li;                                                                       \
            w[j] = wj;                                                                        \
        }                                                                                     \
        for (int64_t j = 0; j < nr; j++) {                                                    \
            double dzd = (double)(a * s[j]), part = dzd * (double)w[j];                       \
            pu[j + 1] = dzd - part;                                                           \
            pv[j + 1] = part;                                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    static void bwd_row_##SUF(const cope_shape *c, T *s, T *dp, const T *f, T *df,           \
                              const uint8_t *m, int64_t nr, T a, T lse, T delta, T *g,       \
                              T *pos, int32_t *lo, T *w, T *sv, double *pu, double *pv,       \
                              int32_t *endj) {                                                \
        if (lse == -(T)INFINITY) { /* no key: no gradient */                                 \
            memset(s, 0, sizeof(T) * c->n);                                                   \
            memset(dp, 0, sizeof(T) * c->n);                                                  \
            memset(df, 0, sizeof(T) * c->fcols);                                              \
            return;                                                                           \
        }                                                                                     \
        gates_##SUF(s, m, nr, g);                                                             \
        scan_##SUF(g, pos, nr, -1, (T)(c->npos - 1));                                         \
        grads_##SUF(c, s, dp, f, nr, a, lse, delta, pos, lo, w, pu, pv);                      \
        if (m != NULL) { /* a masked key: no probability, no gradient */                     \
            for (int64_t j = 0; j < nr; j++) {                                                \
                if (!m[j]) {                                                                  \
                    dp[j] = s[j] = pos[j] = (T)0;                                             \
                    pu[j + 1] = pv[j + 1] = 0.0;                                              \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        table_grad_##SUF(c, lo, nr, df, sv, pu, pv, endj);                                    \
        scan_##SUF(pos, pos, nr, 1, (T)0); /* g_j's gradient: the sum over t <= j */        \
        for (int64_t j = 0; j < nr; j++) s[j] += pos[j] * (g[j] * ((T)1 - g[j]));             \
        if (nr < c->n) {                                                                      \
            memset(s + nr, 0, sizeof(T) * (c->n - nr));                                       \
            memset(dp + nr, 0, sizeof(T) * (c->n - nr));                                      \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    int posenc_cope_positions_##SUF(const cope_shape *c, const T *s, T *pos,                 \
                                    const uint8_t *mask, T *top) {                            \
        int failed = 0;                                                                       \
        _Pragma("omp parallel num_threads(c->threads) reduction(|:failed)") {                 \
            FTZ_ON                                                                            \
            T *g = (T *)malloc(sizeof(T) * (c->n > 0 ? c->n : 1));                            \
            if (g == NULL) {                                                                  \
                failed = 1;                                                                   \
            } else {                                                                          \
                _Pragma("omp for schedule(dynamic, 4)") for (int64_t row = 0; row < c->rows;  \
                                                             row++) {                         \
                    int64_t nr = row_keys(c, row % c->R);                                     \
                    T *p = pos + row * c->n;                                                  \
                    gates_##SUF(s + row * c->n, row_mask(c, mask, row), nr, g);               \
                    scan_##SUF(g, p, nr, -1, (T)(c->npos - 1));                               \
                    top[row] = nr > 0 ? p[0] : (T)0; /* the largest: p falls with j */       \
                }                                                                             \
                free(g);                                                                      \
            }                                                                                 \
            FTZ_OFF                                                                           \
        }                                                                                     \
        return failed;                                                                        \
    }                                                                                         \
                                                                                              \
    int posenc_cope_forward_##SUF(const cope_shape *c, T *s, const T *f, const T *pos,       \
                                  const uint8_t *mask, T *lse, double a) {                    \
        int failed = 0;                                                                       \
        _Pragma("omp parallel num_threads(c->threads)") {                                     \
            FTZ_ON                                                                            \
            _Pragma("omp for schedule(dynamic, 4)") for (int64_t row = 0; row < c->rows;      \
                                                         row++) {                             \
                fwd_row_##SUF(c, s + row * c->n, f + row * c->fcols, pos + row * c->n,        \
                              row_mask(c, mask, row), row_keys(c, row % c->R), (T)a,           \
                              lse + row);                                                     \
            }                                                                                 \
            FTZ_OFF                                                                           \
        }                                                                                     \
        return failed;                                                                        \
    }                                                                                         \
                                                                                              \
    int posenc_cope_backward_##SUF(const cope_shape *c, T *s, T *dp, const T *f, T *df,      \
                                   const uint8_t *mask, const T *lse, const T *delta,         \
                                   double a) {                                                \
        int failed = 0;                                                                       \
        _Pragma("omp parallel num_threads(c->threads) reduction(|:failed)") {                 \
            FTZ_ON                                                                            \
            int64_t n1 = c->n > 0 ? c->n : 1;                                                 \
            size_t bytes = sizeof(double) * 2 * (n1 + 1) + sizeof(T) * (3 * n1 + c->fcols)    \
                           + sizeof(int32_t) * (n1 + c->fcols);                               \
            char *mem = (char *)malloc(bytes);                                                \
            if (mem == NULL) {                                                                \
                failed = 1;                                                                   \
            } else {                                                                          \
                double *pu = (double *)mem, *pv = pu + n1 + 1;                                \
                T *g = (T *)(pv + n1 + 1), *pos = g + n1, *w = pos + n1, *sv = w + n1;        \
                int32_t *lo = (int32_t *)(sv + c->fcols), *endj = lo + n1;                    \
                _Pragma("omp for schedule(dynamic, 4)") for (int64_t row = 0; row < c->rows;  \
                                                             row++) {                         \
                    bwd_row_##SUF(c, s + row * c->n, dp + row * c->n, f + row * c->fcols,     \
                                  df + row * c->fcols, row_mask(c, mask, row),                 \
                                  row_keys(c, row % c->R), (T)a, lse[row], delta[row], g,     \
                                  pos, lo, w, sv, pu, pv, endj);                              \
                }                                                                             \
                free(mem);                                                                    \
            }                                                                                 \
            FTZ_OFF                                                                           \
        }                                                                                     \
        return failed;                                                                        \
    }

DEFINE_COPE(float, f32, exp_f32, floorf)
DEFINE_COPE(double, f64, exp_f64, floor)
