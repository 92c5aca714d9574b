/* The vector pieces of CoPE's row loops (cope_cpu.c includes this file once; posenc._native
 * hashes it with the source): the float exponential, prefix and suffix sums in double, and
 * the interpolation of eight keys' table logits at once.
 *
 * The float exponential is a polynomial the compiler vectorises (relative error below 2 ulp;
 * fused multiply-adds where the CPU has them); double uses libm. The sums over keys and the
 * float interpolation are written with GCC's vector extensions (clang has them too), which
 * the compiler lowers to the CPU's vectors or to scalar code: no intrinsics, the same source
 * on every machine.
 */
#ifndef POSENC_COPE_VEC_H
#define POSENC_COPE_VEC_H
#include <math.h>
#include <stdint.h>
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

#endif /* POSENC_COPE_VEC_H */
