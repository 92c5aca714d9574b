/* 16-bit conversions for rope_cpu.c, round to nearest even as torch does: scalar forms
 * for strided rows, span forms (contiguous, vectorized) for the rest. Included once,
 * after <stdint.h> and <immintrin.h>. */
#ifndef POSENC_ROPE_F16_H
#define POSENC_ROPE_F16_H

/* ---- 16-bit conversions, round to nearest even as torch does ------------------------
 * Scalar forms for strided rows, span forms (contiguous, vectorized) for the rest. The
 * build uses -fno-strict-aliasing: float buffers are also written through uint32_t. */

static inline float bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_round(uint32_t u) {
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u; /* NaN stays a (quiet) NaN */
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}

static inline uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return bf16_round(u);
}

static void bf16_in(const uint16_t *restrict x, float *restrict out, int64_t n) {
    uint32_t *o = (uint32_t *)out;
    int64_t i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_si256((__m256i *)(o + i), _mm256_slli_epi32(h, 16));
    }
#endif
    for (; i < n; ++i) o[i] = (uint32_t)x[i] << 16;
}

static void bf16_out(const float *restrict in, uint16_t *restrict y, int64_t n) {
    const uint32_t *u = (const uint32_t *)in;
    int64_t i = 0;
#ifdef __AVX2__
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(u + i));
        __m256i high = _mm256_srli_epi32(v, 16);
        __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(v, bias), _mm256_and_si256(high, one)), 16);
        __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs_mask), inf);
        __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), is_nan);
        __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(y + i), packed);
    }
#endif
    for (; i < n; ++i) y[i] = bf16_round(u[i]);
}

#ifdef __F16C__
static inline float f16_load(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f16_store(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static void f16_in(const uint16_t *restrict x, float *restrict out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; ++i) out[i] = f16_load(x[i]);
}

static void f16_out(const float *restrict in, uint16_t *restrict y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) y[i] = f16_store(in[i]);
}
#else
static inline float f16_load(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}

static inline uint16_t f16_store(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, sizeof h);
    return h;
}

static void f16_in(const uint16_t *restrict x, float *restrict out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = f16_load(x[i]);
}

static void f16_out(const float *restrict in, uint16_t *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = f16_store(in[i]);
}
#endif

#endif /* POSENC_ROPE_F16_H */
