/* Fused rotary embedding on the CPU: one read and one write of q and k.
 *
 * Built on first use by posenc/rotary/kernels/cpu.py (cc -O3 -march=native -fopenmp
 * -ffp-contract=off) and called through ctypes. Every output element is
 *
 *     out[a] = x[a] * cos - x[b] * sin,    out[b] = x[b] * cos + x[a] * sin
 *
 * with each product rounded and then summed, exactly as the plain torch twin
 * (posenc.rotary.apply._apply_rotary_torch) computes it: no fused multiply-add
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
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { POSENC_F32 = 0, POSENC_BF16 = 1, POSENC_F16 = 2, POSENC_F64 = 3 };

/* Per tensor: 3 x (size, x stride, y stride, cos stride), then the channel strides of x
 * and y and the head dim d. Strides are in elements. */
enum { META_DIMS = 0, META_XSD = 12, META_YSD = 13, META_D = 14, META_LEN = 15 };

/* ---- dtype conversions (round to nearest even, as torch does) ------------------------ */

static inline float bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Pairs per step of the interleaved layout's buffers. */
#define CHUNK 128

#define F32_LOAD(v) (v)
#define F32_STORE(v) (v)
#define BF16_LOAD(v) bf16_load(v)
#define BF16_STORE(v) bf16_store(v)
#define F16_LOAD(v) ((float)(v))
#define F16_STORE(v) ((_Float16)(v))
#define F64_LOAD(v) (v)
#define F64_STORE(v) (v)

/* ---- one row (one head of one token) --------------------------------------------------
 * half:        pairs (f, f + r2);  interleaved: pairs (2f, 2f + 1).
 * half_ip writes in place (x == y); inter reads each chunk before writing it, so it may
 * too; the strided variant handles any channel stride and aliasing (each pair is read
 * before it is written). sg is +1 (forward) or -1
 * (backward: the inverse rotation, sin negated). */
#define DEFINE_ROWS(SUF, T, C, LD, ST)                                                        \
    static void half_##SUF(const T *restrict x, T *restrict y, const C *restrict c,          \
                           const C *restrict s, int64_t r2, C sg) {                          \
        for (int64_t f = 0; f < r2; ++f) {                                                    \
            C a = LD(x[f]), b = LD(x[f + r2]), cf = c[f], sf = sg * s[f];                     \
            y[f] = ST(a * cf - b * sf);                                                       \
            y[f + r2] = ST(b * cf + a * sf);                                                  \
        }                                                                                     \
    }                                                                                         \
    static void half_ip_##SUF(T *restrict x, const C *restrict c, const C *restrict s,       \
                              int64_t r2, C sg) {                                             \
        for (int64_t f = 0; f < r2; ++f) {                                                    \
            C a = LD(x[f]), b = LD(x[f + r2]), cf = c[f], sf = sg * s[f];                     \
            x[f] = ST(a * cf - b * sf);                                                       \
            x[f + r2] = ST(b * cf + a * sf);                                                  \
        }                                                                                     \
    }                                                                                         \
    /* Interleaved pairs go through contiguous buffers: computed in place on (2f, 2f+1),   \
     * GCC's SLP vectorizer turns the alternating -/+ into fused multiply-add-subtract      \
     * (vfmaddsub) even under -ffp-contract=off, which rounds differently. */              \
    static void inter_##SUF(const T *x, T *y, const C *restrict c, const C *restrict s,     \
                            int64_t r2, C sg) {                                               \
        C a[CHUNK], b[CHUNK], o1[CHUNK], o2[CHUNK];                                           \
        for (int64_t f0 = 0; f0 < r2; f0 += CHUNK) {                                          \
            int64_t n = r2 - f0 < CHUNK ? r2 - f0 : CHUNK;                                    \
            for (int64_t f = 0; f < n; ++f) {                                                 \
                a[f] = LD(x[2 * (f0 + f)]);                                                   \
                b[f] = LD(x[2 * (f0 + f) + 1]);                                               \
            }                                                                                 \
            for (int64_t f = 0; f < n; ++f) {                                                 \
                C cf = c[f0 + f], sf = sg * s[f0 + f];                                        \
                o1[f] = a[f] * cf - b[f] * sf;                                                \
                o2[f] = b[f] * cf + a[f] * sf;                                                \
            }                                                                                 \
            for (int64_t f = 0; f < n; ++f) {                                                 \
                y[2 * (f0 + f)] = ST(o1[f]);                                                  \
                y[2 * (f0 + f) + 1] = ST(o2[f]);                                              \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void strided_##SUF(const T *x, T *y, int64_t xsd, int64_t ysd, const C *c,         \
                              const C *s, int64_t r2, C sg, int interleaved) {               \
        int64_t step = interleaved ? 2 : 1, other = interleaved ? 1 : r2;                     \
        for (int64_t f = 0; f < r2; ++f) {                                                    \
            int64_t i = f * step, j = i + other;                                              \
            C a = LD(x[i * xsd]), b = LD(x[j * xsd]), cf = c[f], sf = sg * s[f];              \
            y[i * ysd] = ST(a * cf - b * sf);                                                 \
            y[j * ysd] = ST(b * cf + a * sf);                                                 \
        }                                                                                     \
    }                                                                                         \
    static void row_##SUF(const void *xv, void *yv, int64_t xsd, int64_t ysd, int64_t d,      \
                          const void *cv, const void *sv, int64_t r2, int sign,               \
                          int interleaved, int inplace) {                                     \
        const T *x = (const T *)xv;                                                           \
        T *y = (T *)yv;                                                                       \
        const C *c = (const C *)cv, *s = (const C *)sv;                                       \
        C sg = (C)sign;                                                                       \
        if (xsd == 1 && ysd == 1) {                                                           \
            if (inplace)                                                                      \
                (interleaved ? inter_##SUF(y, y, c, s, r2, sg)                               \
                             : half_ip_##SUF(y, c, s, r2, sg));                               \
            else                                                                              \
                (interleaved ? inter_##SUF : half_##SUF)(x, y, c, s, r2, sg);                 \
            if (!inplace && d > 2 * r2)                                                       \
                memcpy(y + 2 * r2, x + 2 * r2, (size_t)(d - 2 * r2) * sizeof(T));             \
        } else {                                                                              \
            strided_##SUF(x, y, xsd, ysd, c, s, r2, sg, interleaved);                         \
            if (!inplace)                                                                     \
                for (int64_t i = 2 * r2; i < d; ++i) y[i * ysd] = x[i * xsd];                 \
        }                                                                                     \
    }

DEFINE_ROWS(f32, float, float, F32_LOAD, F32_STORE)
DEFINE_ROWS(bf16, uint16_t, float, BF16_LOAD, BF16_STORE)
DEFINE_ROWS(f16, _Float16, float, F16_LOAD, F16_STORE)
DEFINE_ROWS(f64, double, double, F64_LOAD, F64_STORE)

typedef void (*row_fn)(const void *, void *, int64_t, int64_t, int64_t, const void *,
                       const void *, int64_t, int, int, int);

/* Rows [lo, hi) of one tensor. */
static void run_rows(row_fn row, size_t esize, size_t csize, const int64_t *m, const char *x,
                     char *y, const char *cos, const char *sin, int64_t r2, int sign,
                     int interleaved, int inplace, int64_t lo, int64_t hi) {
    const int64_t n1 = m[4], n2 = m[8];
    int64_t i0 = lo / (n1 * n2), i1 = (lo / n2) % n1, i2 = lo % n2;
    for (int64_t r = lo; r < hi; ++r) {
        int64_t xo = i0 * m[1] + i1 * m[5] + i2 * m[9];
        int64_t yo = i0 * m[2] + i1 * m[6] + i2 * m[10];
        int64_t co = i0 * m[3] + i1 * m[7] + i2 * m[11];
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

/* Rotate up to two tensors (q and k) in one parallel region.
 * Returns 0 on success, -1 for an unknown dtype. */
int posenc_rope(int dtype, int interleaved, int sign, int inplace, int ntensors,
                const int64_t *meta, const void *const *xs, void *const *ys, const void *cos,
                const void *sin, int64_t r2, int nthreads) {
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
                         interleaved, inplace, a - base, b - base);
            base += rows[t];
        }
    }
    return 0;
}
