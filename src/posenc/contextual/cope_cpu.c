/* CoPE's row work for posenc's fused CPU attention (posenc/contextual/cope_fused.py).
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
 * For a row, the keys it may attend are j < n_row (seen[r], causal) with mask[j] != 0;
 * g_j = sigmoid(S_j) on them (0 elsewhere), p_j = min(sum_{t >= j} g_t, npos - 1) summed
 * in double, z_j = F[lo] + w (F[hi] - F[lo]) with lo = floor p, hi = min(lo + 1, npos - 1),
 * w = p - lo, and the logit S_j + a z_j (a = scale or 1). A row with no key gives P = 0
 * (its output 0) and no gradient. NaN in gives NaN out.
 *
 * Each function exists for float (suffix _f32) and double (_f64); the vector pieces they
 * are made of (the exponential, the sums, the interpolation) are in cope_vec.h.
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
#include "cope_vec.h"

typedef struct {
    int64_t rows;       /* B * R rows, B = b * h */
    int64_t R;          /* rows per (batch, head) */
    int64_t H;          /* heads (to split B into b, h for the mask) */
    int64_t n;          /* keys per row */
    int64_t npos;       /* table rows (positions 0 .. npos - 1) */
    const int64_t *seen; /* row r sees keys j < seen[r] (causal); NULL: all n */
    int64_t mb, mh, mr; /* mask strides (bytes) of batch, head and row; mask NULL: all */
    int64_t fcols;      /* table logits per row (> the largest position the row reaches) */
    int64_t threads;
} cope_shape;

static inline int64_t row_keys(const cope_shape *c, int64_t r) {
    if (c->seen == NULL) return c->n;
    return c->seen[r] < c->n ? c->seen[r] : c->n;
}

static inline const uint8_t *row_mask(const cope_shape *c, const uint8_t *mask, int64_t row) {
    if (mask == NULL) return NULL;
    int64_t bh = row / c->R, r = row % c->R;
    return mask + (bh / c->H) * c->mb + (bh % c->H) * c->mh + r * c->mr;
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
