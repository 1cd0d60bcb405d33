/* One pass over a contiguous float32 or float64 tensor for every statistic of hooks.stats.RAW.
 *
 * Built by hooks/native.py with the machine's C compiler; called through ctypes, which releases
 * the GIL. A tensor of more than one CHUNK is split over PyTorch's OpenMP threads (hr_reduce).
 *
 * The tensor is read in blocks of BLOCK elements. A block is first summed in its own precision
 * (`fast_*`: sums, zero count, min and max in one vectorised loop; float32 lanes hold twice the
 * elements of float64 ones, which made the pass 2-3x faster than widening every element), and
 * the block's sums are added to double totals, so rounding does not grow with the tensor's length
 * (within a block, each vector lane adds BLOCK / lanes elements). When a block's sums are not
 * finite (a NaN or Inf in it, or float32 sums of finite values that overflowed), the block is
 * summed again element by element in double (`exact_*`), which counts NaN and Inf and never
 * overflows for float32 data. Sums run around `shift` (see SHIFT), so the variance of data whose
 * mean dwarfs its spread does not cancel. A NaN anywhere makes min and max NaN, as torch.aminmax
 * gives. Nothing here assumes finite values (kernel_keys.h says how min and max still vectorise).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernel_keys.h"

#define BLOCK 256
/* Elements a thread reduces at a time (256 KB of float32), and chunks in flight at once. */
#define CHUNK (1 << 16)
#define MAX_CHUNKS 256

typedef struct {
    double sum, sumsq, abs_sum, lo, hi;
    int64_t zeros, nans, infs;
} totals_t;

/* A block in its own precision, vectorised. A block holding a NaN or an Inf gives non-finite sums
 * (IEEE arithmetic: nothing here assumes finite values), and the caller sums it again exactly, so
 * its extremes here need not be right for NaN. */
#define FAST(NAME, T, K, ABS)                                                          \
    static void NAME(const T *x, int64_t n, T shift, T *sums, T *lo, T *hi, int32_t *zeros) { \
        T sum = 0, sumsq = 0, abs_sum = 0;                                           \
        K l = key_##T(x[0]), h = l;                                                  \
        int32_t z = 0;                                                               \
        for (int64_t i = 0; i < n; i++) {                                            \
            const T v = x[i], d = v - shift;                                         \
            const K k = key_##T(v);                                                  \
            sum += d;                                                                \
            sumsq += d * d;                                                          \
            abs_sum += ABS(v);                                                       \
            z += v == 0;                                                             \
            l = k < l ? k : l;                                                       \
            h = k > h ? k : h;                                                       \
        }                                                                            \
        sums[0] = sum;                                                               \
        sums[1] = sumsq;                                                             \
        sums[2] = abs_sum;                                                           \
        *lo = value_##T(l);                                                          \
        *hi = value_##T(h);                                                          \
        *zeros = z;                                                                  \
    }

/* A block element by element in double, with IEEE comparisons: NaN and Inf counted, a NaN
 * carried into the sums (and so into the mean), float32 sums that cannot overflow. */
#define EXACT(NAME, T)                                                                 \
    static void NAME(const T *x, int64_t n, double shift, totals_t *t) {            \
        for (int64_t i = 0; i < n; i++) {                                            \
            const double v = x[i], d = v - shift;                                    \
            t->sum += d;                                                             \
            t->sumsq += d * d;                                                       \
            t->abs_sum += fabs(v);                                                   \
            t->zeros += v == 0;                                                      \
            t->nans += v != v;                                                       \
            t->infs += isinf(v) != 0;                                                \
            t->lo = v < t->lo ? v : t->lo;                                           \
            t->hi = v > t->hi ? v : t->hi;                                           \
        }                                                                            \
    }

/* The whole tensor, block by block: a block whose fast sums are finite is added as it is, any
 * other is summed again exactly, as is a block of magnitudes all below `tiny` (float32 squares
 * below 2^-60 lose their digits to underflow; hooks.stats.eager_reductions does the same). */
#define REDUCE(NAME, FAST_NAME, EXACT_NAME, T, TINY)                                   \
    static void NAME(const T *x, int64_t n, double shift, totals_t *t) {            \
        for (int64_t start = 0; start < n; start += BLOCK) {                         \
            const int64_t m = n - start < BLOCK ? n - start : BLOCK;                 \
            T sums[3], lo, hi;                                                       \
            int32_t zeros;                                                           \
            FAST_NAME(x + start, m, (T)shift, sums, &lo, &hi, &zeros);               \
            if (!(isfinite(sums[0]) && isfinite(sums[1]) && isfinite(sums[2]))       \
                || (hi > -lo ? hi : -lo) < (TINY)) {                                 \
                EXACT_NAME(x + start, m, shift, t);                                  \
                continue;                                                            \
            }                                                                        \
            t->sum += sums[0];                                                       \
            t->sumsq += sums[1];                                                     \
            t->abs_sum += sums[2];                                                   \
            t->zeros += zeros;                                                       \
            t->lo = lo < t->lo ? lo : t->lo;                                         \
            t->hi = hi > t->hi ? hi : t->hi;                                         \
        }                                                                            \
    }

/* The shift: 0, unless the first block's finite elements sit far from 0 for their spread (mean
 * beyond 4 mean absolute deviations), then their mean rounded to 8 significant bits. Why both:
 * v - shift is rounded in T, and with a shift of full precision that rounding is biased the same
 * way for every v of a binade (measured: 6.4 M randn values, a shift of 0.026 moved the sum by
 * 5e-3); with 0 there is no subtraction, and a short shift near data it is close to subtracts
 * exactly. */
#define SHIFT(NAME, T)                                                                 \
    static double NAME(const T *x, int64_t n) {                                      \
        double sum = 0, dev = 0;                                                     \
        int64_t count = 0;                                                           \
        const int64_t m = n < BLOCK ? n : BLOCK;                                     \
        for (int64_t i = 0; i < m; i++)                                              \
            if (isfinite(x[i])) {                                                    \
                sum += x[i];                                                         \
                count++;                                                             \
            }                                                                        \
        if (!count)                                                                  \
            return 0.0;                                                              \
        const double mean = sum / count;                                             \
        for (int64_t i = 0; i < m; i++)                                              \
            if (isfinite(x[i]))                                                      \
                dev += fabs(x[i] - mean);                                            \
        if (fabs(mean) <= 4 * dev / count)                                           \
            return 0.0;                                                              \
        int exponent;                                                                \
        const double fraction = frexp(mean, &exponent);                              \
        return (double)(T)ldexp(round(ldexp(fraction, 8)), exponent - 8);            \
    }

SHIFT(shift_f32, float)
SHIFT(shift_f64, double)
FAST(fast_f32, float, int32_t, fabsf)
FAST(fast_f64, double, int64_t, fabs)
EXACT(exact_f32, float)
EXACT(exact_f64, double)
REDUCE(reduce_f32, fast_f32, exact_f32, float, 0x1p-60f)
REDUCE(reduce_f64, fast_f64, exact_f64, double, 0.0)

/* The totals of a chunk added to those of the chunks before it. */
static void combine(totals_t *t, const totals_t *c) {
    t->sum += c->sum;
    t->sumsq += c->sumsq;
    t->abs_sum += c->abs_sum;
    t->lo = c->lo < t->lo ? c->lo : t->lo;
    t->hi = c->hi > t->hi ? c->hi : t->hi;
    t->zeros += c->zeros;
    t->nans += c->nans;
    t->infs += c->infs;
}

/* hooks.stats.RAW of the n > 0 elements at x (float64 if is_double, else float32) into out[9].
 * A tensor of more than one CHUNK is reduced chunk by chunk on PyTorch's own OpenMP threads (torch
 * loaded libgomp first, so this is its pool, whose workers are still spinning from the operator
 * before), each chunk into totals of its own, added in chunk order: the result does not depend on
 * the number of threads. */
void hr_reduce(const void *x, int64_t n, int is_double, double *out) {
    const double shift = is_double ? shift_f64((const double *)x, n) : shift_f32((const float *)x, n);
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
    totals_t t = {.lo = INFINITY, .hi = -INFINITY};
    totals_t part[MAX_CHUNKS];
    for (int64_t first = 0; first < chunks; first += MAX_CHUNKS) {
        const int64_t count = chunks - first < MAX_CHUNKS ? chunks - first : MAX_CHUNKS;
#pragma omp parallel for schedule(static) if (count > 1)
        for (int64_t c = 0; c < count; c++) {
            const int64_t start = (first + c) * CHUNK, m = n - start < CHUNK ? n - start : CHUNK;
            part[c] = (totals_t){.lo = INFINITY, .hi = -INFINITY};
            if (is_double)
                reduce_f64((const double *)x + start, m, shift, &part[c]);
            else
                reduce_f32((const float *)x + start, m, shift, &part[c]);
        }
        for (int64_t c = 0; c < count; c++)
            combine(&t, &part[c]);
    }
    out[0] = t.sum;
    out[1] = t.sumsq;
    out[2] = t.abs_sum;
    out[3] = t.nans ? NAN : t.lo;
    out[4] = t.nans ? NAN : t.hi;
    out[5] = (double)t.zeros;
    out[6] = (double)t.nans;
    out[7] = (double)t.infs;
    out[8] = shift;
}
