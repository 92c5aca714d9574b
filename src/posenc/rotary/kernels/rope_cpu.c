/* Fused rotary embedding on the CPU: one read and one write of q and k.
 *
 * Built on first use by posenc/rotary/kernels/cpu.py (cc -O3 -march=native -fopenmp
 * -ffp-contract=off) and called through ctypes. Every output element is
 *
 *     out[a] = x[a] * cos - x[b] * sin,    out[b] = x[b] * cos + x[a] * sin
 *
 * with each product rounded and then summed, exactly as the plain torch twin
 * (posenc.rotary.kernels.plain.apply_rotary_torch) computes it: no fused multiply-add
 * (-ffp-contract=off), math in float32 for float32/bf16/fp16 (float64 for float64),
 * one rounding to the input dtype. So the two paths agree bit for bit.
 *
 * Work is split into "rows": one head of one token, d channels. A tensor is
 * described by its three outer dimensions in iteration order (the caller sorts
 * them by stride so that rows are visited in memory order), each with its stride
 * in x, in y and in the cos/sin table (0 for the head dimension: cos/sin are
 * loaded per token and reused across heads). Rows of q and k are concatenated
 * and split evenly over the OpenMP threads in one parallel region.
 */
#define _DEFAULT_SOURCE /* madvise and MADV_HUGEPAGE under -std=c11 */
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { POSENC_F32 = 0, POSENC_BF16 = 1, POSENC_F16 = 2, POSENC_F64 = 3 };

/* Per tensor: 3 x (size, x stride, y stride, cos stride), then the channel strides of x
 * and y and the head dim d. Strides are in elements. */
enum { META_DIMS = 0, META_XSD = 12, META_YSD = 13, META_D = 14, META_LEN = 15 };

/* Pairs per step of the buffered rows. */
#define CHUNK 128

#include "rope_f16.h" /* bf16 / fp16 loads, stores and spans */

#define ID(v) (v)

/* ---- the arithmetic on contiguous buffers ------------------------------------------
 * half: pairs (f, f + r2); interleaved: pairs (2f, 2f + 1). sg is +1 (forward) or -1
 * (backward: the inverse rotation, sin negated). */
#define DEFINE_ROTATE(C)                                                                      \
    static inline void rotate_##C(const C *restrict a, const C *restrict b,                  \
                                  const C *restrict c, const C *restrict s, C sg,             \
                                  C *restrict o1, C *restrict o2, int64_t n) {                \
        for (int64_t f = 0; f < n; ++f) {                                                     \
            C cf = c[f], sf = sg * s[f];                                                      \
            o1[f] = a[f] * cf - b[f] * sf;                                                    \
            o2[f] = b[f] * cf + a[f] * sf;                                                    \
        }                                                                                     \
    }
DEFINE_ROTATE(float)
DEFINE_ROTATE(double)

/* float32 / float64 rows. The half layout is rotated directly (out of place, or in place
 * through one pointer); the interleaved layout goes through buffers: computed in place on
 * (2f, 2f+1), GCC's SLP vectorizer turns the alternating -/+ into fused multiply-add-
 * subtract (vfmaddsub) even under -ffp-contract=off, which rounds differently. Each chunk
 * is read before it is written, so x == y is fine there too. */
#define DEFINE_ROWS(SUF, C)                                                                   \
    static void half_##SUF(const C *restrict x, C *restrict y, const C *restrict c,          \
                           const C *restrict s, int64_t r2, C sg) {                          \
        for (int64_t f = 0; f < r2; ++f) {                                                    \
            C a = x[f], b = x[f + r2], cf = c[f], sf = sg * s[f];                             \
            y[f] = a * cf - b * sf;                                                           \
            y[f + r2] = b * cf + a * sf;                                                      \
        }                                                                                     \
    }                                                                                         \
    static void half_ip_##SUF(C *restrict x, const C *restrict c, const C *restrict s,       \
                              int64_t r2, C sg) {                                             \
        for (int64_t f = 0; f < r2; ++f) {                                                    \
            C a = x[f], b = x[f + r2], cf = c[f], sf = sg * s[f];                             \
            x[f] = a * cf - b * sf;                                                           \
            x[f + r2] = b * cf + a * sf;                                                      \
        }                                                                                     \
    }                                                                                         \
    static void inter_##SUF(const C *x, C *y, const C *c, const C *s, int64_t r2, C sg) {     \
        C a[CHUNK], b[CHUNK], o1[CHUNK], o2[CHUNK];                                           \
        for (int64_t f0 = 0; f0 < r2; f0 += CHUNK) {                                          \
            int64_t n = r2 - f0 < CHUNK ? r2 - f0 : CHUNK;                                    \
            const C *xs = x + 2 * f0;                                                         \
            C *ys = y + 2 * f0;                                                               \
            for (int64_t f = 0; f < n; ++f) {                                                 \
                a[f] = xs[2 * f];                                                             \
                b[f] = xs[2 * f + 1];                                                         \
            }                                                                                 \
            rotate_##C(a, b, c + f0, s + f0, sg, o1, o2, n);                                  \
            for (int64_t f = 0; f < n; ++f) {                                                 \
                ys[2 * f] = o1[f];                                                            \
                ys[2 * f + 1] = o2[f];                                                        \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void contiguous_##SUF(const C *x, C *y, const C *c, const C *s, int64_t r2, C sg,  \
                                 int interleaved, int inplace) {                              \
        if (interleaved)                                                                      \
            inter_##SUF(x, y, c, s, r2, sg);                                                  \
        else if (inplace)                                                                     \
            half_ip_##SUF(y, c, s, r2, sg);                                                   \
        else                                                                                  \
            half_##SUF(x, y, c, s, r2, sg);                                                   \
    }
DEFINE_ROWS(f32, float)
DEFINE_ROWS(f64, double)

/* bf16 / fp16 rows in the half layout: one pass, loaded, rotated and rounded WIDE pairs
 * at a time (16 with AVX-512, 8 with AVX2; the same float32 products and roundings as the
 * scalar tail). x may be y (in place): each step reads its elements before it writes
 * them, and no two steps touch the same ones. */
#if defined(__AVX512F__)
#define WIDE 16
typedef __m512 vf;
typedef __m512i vi;
#define V_LOADF(p) _mm512_loadu_ps(p)
#define V_SET1(v) _mm512_set1_ps(v)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
static inline vf bf16v_load(const uint16_t *p) {
    vi w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline void bf16v_store(uint16_t *p, vf v) {
    const vi u = _mm512_castps_si512(v), high = _mm512_srli_epi32(u, 16);
    const vi rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(high, _mm512_set1_epi32(1))),
        16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const vi r =
        _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}
static inline vf f16v_load(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void f16v_store(uint16_t *p, vf v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
#elif defined(__AVX2__) && defined(__F16C__)
#define WIDE 8
typedef __m256 vf;
typedef __m256i vi;
#define V_LOADF(p) _mm256_loadu_ps(p)
#define V_SET1(v) _mm256_set1_ps(v)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
static inline vf bf16v_load(const uint16_t *p) {
    vi w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline void bf16v_store(uint16_t *p, vf v) {
    const vi u = _mm256_castps_si256(v), high = _mm256_srli_epi32(u, 16);
    const vi rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(high, _mm256_set1_epi32(1))),
        16);
    const vi nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                      _mm256_set1_epi32(0x7f800000));
    const vi r = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
    _mm_storeu_si128((__m128i *)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
static inline vf f16v_load(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline void f16v_store(uint16_t *p, vf v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
#else
#define WIDE 0
#endif

#if WIDE
#define WIDE_STEPS(SUF)                                                                       \
    const vf vsg = V_SET1(sg);                                                                \
    for (; f + WIDE <= r2; f += WIDE) {                                                       \
        vf a = SUF##v_load(x + f), b = SUF##v_load(x + f + r2);                               \
        vf cf = V_LOADF(c + f), sf = V_MUL(vsg, V_LOADF(s + f));                              \
        SUF##v_store(y + f, V_SUB(V_MUL(a, cf), V_MUL(b, sf)));                               \
        SUF##v_store(y + f + r2, V_ADD(V_MUL(b, cf), V_MUL(a, sf)));                          \
    }
#else
#define WIDE_STEPS(SUF)
#endif

#define DEFINE_HALF16(SUF)                                                                    \
    static void half16_##SUF(const uint16_t *x, uint16_t *y, const float *restrict c,        \
                             const float *restrict s, int64_t r2, float sg) {                 \
        int64_t f = 0;                                                                        \
        WIDE_STEPS(SUF)                                                                       \
        for (; f < r2; ++f) {                                                                 \
            float a = SUF##_load(x[f]), b = SUF##_load(x[f + r2]), cf = c[f], sf = sg * s[f]; \
            float o1 = a * cf - b * sf, o2 = b * cf + a * sf;                                 \
            y[f] = SUF##_store(o1);                                                           \
            y[f + r2] = SUF##_store(o2);                                                      \
        }                                                                                     \
    }
DEFINE_HALF16(bf16)
DEFINE_HALF16(f16)

/* bf16 / fp16 rows: converted span by span into float buffers (vectorized), rotated in
 * float32, rounded back. Each chunk is read before it is written (x == y is fine). */
#define DEFINE_ROWS16(SUF)                                                                    \
    static void contiguous_##SUF(const uint16_t *x, uint16_t *y, const float *c,             \
                                 const float *s, int64_t r2, float sg, int interleaved,       \
                                 int inplace) {                                               \
        (void)inplace;                                                                        \
        if (!interleaved) {                                                                   \
            half16_##SUF(x, y, c, s, r2, sg);                                                 \
            return;                                                                           \
        }                                                                                     \
        float a[CHUNK], b[CHUNK], o1[CHUNK], o2[CHUNK], t[2 * CHUNK];                         \
        for (int64_t f0 = 0; f0 < r2; f0 += CHUNK) {                                          \
            int64_t n = r2 - f0 < CHUNK ? r2 - f0 : CHUNK;                                    \
            if (interleaved) {                                                                \
                SUF##_in(x + 2 * f0, t, 2 * n);                                               \
                for (int64_t f = 0; f < n; ++f) {                                             \
                    a[f] = t[2 * f];                                                          \
                    b[f] = t[2 * f + 1];                                                      \
                }                                                                             \
            } else {                                                                          \
                SUF##_in(x + f0, a, n);                                                       \
                SUF##_in(x + r2 + f0, b, n);                                                  \
            }                                                                                 \
            rotate_float(a, b, c + f0, s + f0, sg, o1, o2, n);                                \
            if (interleaved) {                                                                \
                for (int64_t f = 0; f < n; ++f) {                                             \
                    t[2 * f] = o1[f];                                                         \
                    t[2 * f + 1] = o2[f];                                                     \
                }                                                                             \
                SUF##_out(t, y + 2 * f0, 2 * n);                                              \
            } else {                                                                          \
                SUF##_out(o1, y + f0, n);                                                     \
                SUF##_out(o2, y + r2 + f0, n);                                                \
            }                                                                                 \
        }                                                                                     \
    }
DEFINE_ROWS16(bf16)
DEFINE_ROWS16(f16)

/* ---- one row: contiguous channels, or any channel stride (scalar) -------------------- */
#define DEFINE_ROW(SUF, T, C, LD, ST)                                                         \
    static void row_##SUF(const void *xv, void *yv, int64_t xsd, int64_t ysd, int64_t d,      \
                          const void *cv, const void *sv, int64_t r2, int sign,               \
                          int interleaved, int inplace) {                                     \
        const T *x = (const T *)xv;                                                           \
        T *y = (T *)yv;                                                                       \
        const C *c = (const C *)cv, *s = (const C *)sv;                                       \
        C sg = (C)sign;                                                                       \
        if (xsd == 1 && ysd == 1) {                                                           \
            contiguous_##SUF(x, y, c, s, r2, sg, interleaved, inplace);                       \
            if (!inplace && d > 2 * r2) /* channels past rotary_dim pass through */           \
                memcpy(y + 2 * r2, x + 2 * r2, (size_t)(d - 2 * r2) * sizeof(T));             \
            return;                                                                           \
        }                                                                                     \
        int64_t step = interleaved ? 2 : 1, other = interleaved ? 1 : r2;                     \
        for (int64_t f = 0; f < r2; ++f) { /* each pair is read before it is written */       \
            int64_t i = f * step, j = i + other;                                              \
            C a = LD(x[i * xsd]), b = LD(x[j * xsd]), cf = c[f], sf = sg * s[f];              \
            y[i * ysd] = ST(a * cf - b * sf);                                                 \
            y[j * ysd] = ST(b * cf + a * sf);                                                 \
        }                                                                                     \
        if (!inplace)                                                                         \
            for (int64_t i = 2 * r2; i < d; ++i) y[i * ysd] = x[i * xsd];                     \
    }
DEFINE_ROW(f32, float, float, ID, ID)
DEFINE_ROW(f64, double, double, ID, ID)
DEFINE_ROW(bf16, uint16_t, float, bf16_load, bf16_store)
DEFINE_ROW(f16, uint16_t, float, f16_load, f16_store)

typedef void (*row_fn)(const void *, void *, int64_t, int64_t, int64_t, const void *,
                       const void *, int64_t, int, int, int);

/* Where a row's cos/sin are: at element offset i0 * m[3] + i1 * m[7] + i2 * m[11] of cos
 * and sin, or (gather) at row pos[that offset] of a table whose rows are tstride elements
 * apart (cos the first r2 of each row, sin the next r2: sin = cos + r2). */
typedef struct {
    const void *pos; /* NULL: no gather */
    int pos32;       /* positions are int32 (else int64) */
    int64_t tstride;
} gather_t;

/* Rows [lo, hi) of one tensor. */
static void run_rows(row_fn row, size_t esize, size_t csize, const int64_t *m, const char *x,
                     char *y, const char *cos, const char *sin, int64_t r2, int sign,
                     int interleaved, int inplace, int64_t lo, int64_t hi,
                     const gather_t *g) {
    const int64_t n1 = m[4], n2 = m[8];
    int64_t i0 = lo / (n1 * n2), i1 = (lo / n2) % n1, i2 = lo % n2;
    for (int64_t r = lo; r < hi; ++r) {
        int64_t xo = i0 * m[1] + i1 * m[5] + i2 * m[9];
        int64_t yo = i0 * m[2] + i1 * m[6] + i2 * m[10];
        int64_t co = i0 * m[3] + i1 * m[7] + i2 * m[11];
        if (g->pos)
            co = (g->pos32 ? (int64_t)((const int32_t *)g->pos)[co]
                           : ((const int64_t *)g->pos)[co]) * g->tstride;
        row(x + xo * (int64_t)esize, y + yo * (int64_t)esize, m[META_XSD], m[META_YSD],
            m[META_D], cos + co * (int64_t)csize, sin + co * (int64_t)csize, r2, sign,
            interleaved, inplace);
        if (++i2 == n2) {
            i2 = 0;
            if (++i1 == n1) {
                i1 = 0;
                ++i0;
            }
        }
    }
}

/* Fresh outputs of a few MiB and more: ask the kernel for huge pages on the 2 MiB-aligned
 * part before the first write. Allocations that large come straight from mmap, untouched,
 * and faulting them in 4 KiB pages costs more than the rotation (a clone of the goal
 * size spends three quarters of its time there). Only advice: the contents are not
 * changed and a refusal (THP off, not Linux) changes nothing but the speed. */
static void advise_huge(void *y, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)1 << 21;
    if (bytes < 4 * (int64_t)huge) return;
    uintptr_t lo = ((uintptr_t)y + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)y + (uintptr_t)bytes) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)y;
    (void)bytes;
#endif
}

/* Rotate up to two tensors (q and k) in one parallel region.
 * Returns 0 on success, -1 for an unknown dtype. */
static int rope(int dtype, int interleaved, int sign, int inplace, int ntensors,
                const int64_t *meta, const void *const *xs, void *const *ys, const void *cos,
                const void *sin, int64_t r2, int nthreads, const gather_t *g) {
    row_fn row;
    size_t esize, csize = sizeof(float);
    switch (dtype) {
        case POSENC_F32: row = row_f32; esize = 4; break;
        case POSENC_BF16: row = row_bf16; esize = 2; break;
        case POSENC_F16: row = row_f16; esize = 2; break;
        case POSENC_F64: row = row_f64; esize = 8; csize = sizeof(double); break;
        default: return -1;
    }
    int64_t rows[2] = {0, 0}, total = 0;
    for (int t = 0; t < ntensors; ++t) {
        const int64_t *m = meta + t * META_LEN;
        rows[t] = m[0] * m[4] * m[8];
        total += rows[t];
    }
    if (total == 0) return 0;
    if (!inplace)
        for (int t = 0; t < ntensors; ++t) {
            const int64_t *m = meta + t * META_LEN;
            /* out of place the caller allocated y dense (empty_like): rows x d elements
             * from its first one */
            if (m[META_YSD] == 1) advise_huge(ys[t], rows[t] * m[META_D] * (int64_t)esize);
        }
    if (nthreads < 1) nthreads = 1;
    if (nthreads > total) nthreads = (int)total;

#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
#endif
    {
#ifdef _OPENMP
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        int tid = 0, nt = 1;
#endif
        int64_t lo = total * tid / nt, hi = total * (tid + 1) / nt, base = 0;
        for (int t = 0; t < ntensors; ++t) {
            int64_t a = lo > base ? lo : base, b = hi < base + rows[t] ? hi : base + rows[t];
            if (a < b)
                run_rows(row, esize, csize, meta + t * META_LEN, (const char *)xs[t],
                         (char *)ys[t], (const char *)cos, (const char *)sin, r2, sign,
                         interleaved, inplace, a - base, b - base, g);
            base += rows[t];
        }
    }
    return 0;
}

int posenc_rope(int dtype, int interleaved, int sign, int inplace, int ntensors,
                const int64_t *meta, const void *const *xs, void *const *ys, const void *cos,
                const void *sin, int64_t r2, int nthreads) {
    const gather_t none = {NULL, 0, 0};
    return rope(dtype, interleaved, sign, inplace, ntensors, meta, xs, ys, cos, sin, r2,
                nthreads, &none);
}

/* posenc_rope with its arguments packed in one int64 array (one ctypes argument instead
 * of twelve, and a template the caller reuses across calls of one shape):
 *   p[0] dtype, p[1] interleaved, p[2] sign, p[3] inplace, p[4] ntensors, p[5] r2,
 *   p[6] threads, p[7..8] x pointers, p[9..10] y pointers, p[11] cos, p[12] sin,
 *   p[13..] META_LEN numbers per tensor. */
int posenc_rope_packed(const int64_t *p) {
    const void *xs[2] = {(const void *)(intptr_t)p[7], (const void *)(intptr_t)p[8]};
    void *ys[2] = {(void *)(intptr_t)p[9], (void *)(intptr_t)p[10]};
    if (p[4] < 1 || p[4] > 2) return -2;
    return posenc_rope((int)p[0], (int)p[1], (int)p[2], (int)p[3], (int)p[4], p + 13, xs, ys,
                       (const void *)(intptr_t)p[11], (const void *)(intptr_t)p[12], p[5],
                       (int)p[6]);
}

/* The rotation at positions read from a cos/sin table in the same call (a decoding step's
 * gather and rotation in one foreign call). p[0..12] as posenc_rope_packed, p[11] the
 * table's first cos (row 0) and p[12] its first sin (p[11] + r2 elements), then
 *   p[13] positions (0: none, the rows are the table's first s, as the meta's cos strides
 *   say), p[14] 1 for int32 positions (else int64), p[15] the table's row stride and p[16]
 *   its number of rows (elements), p[17], p[18] the positions' batch and sequence sizes,
 *   p[19], p[20] their strides, p[21..] the META_LEN numbers per tensor, whose cos strides
 *   are the positions' (b, s) strides.
 * Every position is checked to lie in [0, rows) before anything is read or written:
 * returns 1 (nothing written) if one does not, so the caller takes its general path. */
int posenc_rope_table_packed(const int64_t *p) {
    const void *xs[2] = {(const void *)(intptr_t)p[7], (const void *)(intptr_t)p[8]};
    void *ys[2] = {(void *)(intptr_t)p[9], (void *)(intptr_t)p[10]};
    const void *pos = (const void *)(intptr_t)p[13];
    const int pos32 = (int)p[14];
    const int64_t rows = p[16], pb = p[17], ps = p[18], sb = p[19], ss = p[20];
    if (p[4] < 1 || p[4] > 2) return -2;
    if (pos == NULL) {
        if (ps > rows) return 1;
    } else {
        for (int64_t i = 0; i < pb; ++i)
            for (int64_t j = 0; j < ps; ++j) {
                int64_t o = i * sb + j * ss;
                int64_t v = pos32 ? (int64_t)((const int32_t *)pos)[o] : ((const int64_t *)pos)[o];
                if (v < 0 || v >= rows) return 1;
            }
    }
    const gather_t g = {pos, pos32, p[15]};
    return rope((int)p[0], (int)p[1], (int)p[2], (int)p[3], (int)p[4], p + 21, xs, ys,
                (const void *)(intptr_t)p[11], (const void *)(intptr_t)p[12], p[5], (int)p[6],
                &g);
}
