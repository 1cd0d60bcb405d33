/* One pass over a batch of layer outputs for every per-unit statistic of hooks.unit_stats.
 *
 * Built and loaded by hooks/native.py like stats_kernel.c, with OpenMP; called through ctypes (the
 * GIL is released); the units are split over PyTorch's OpenMP threads.
 *
 * The input is [batch, units, positions], contiguous, float32 or float64: one row per (sample,
 * unit), its positions (pixels, tokens) next to each other. Per unit it writes the sum and the sum
 * of squares of (value - shift[unit]) accumulated in double (shift: the unit's running mean, so
 * the caller's M2 = S2 - S1^2 / n does not cancel), min, max and the count above the threshold,
 * and adds each value's quantile-sketch bucket to sketch[unit]; per row (sample, unit) it writes
 * the min and max with the first position of each, what the top-k candidates are made of: PyTorch's
 * max(dim) and min(dim), so a row holding a NaN has NaN for both, at its first NaN. Nothing here
 * assumes finite values (kernel_keys.h says how min and max still vectorise).
 *
 * The sketch bucket (hooks.unit_stats.SketchGrid defines it; its eager index() is the same
 * arithmetic): the magnitude m = |(float)v| as float32; its bit pattern b, read as an integer, is
 * piecewise linear in log2(m), so key = floor(b * multiplier) clamped to [first, last] is a bucket
 * of bounded relative width (DDSketch's linearly interpolated mapping). One int-to-double
 * conversion, one product and a floor per value: vectorised, and exact, so the kernel and the
 * eager index agree bucket for bucket. m < low (and NaN) goes to the zero bucket.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernel_keys.h"

#define BLOCK 256

typedef struct {
    double threshold, multiplier;
    float low;
    int32_t first, last, side;
} units_params_t;

/* Each value's sketch bucket (an index into the unit's row of 2 side + 1 counts), vectorised (with
 * the clamps as comparisons: fmin and fmax keep the loop scalar). */
#define BUCKETS(NAME, T)                                                                                \
    static void NAME(const T *x, int64_t n, const units_params_t *p, int32_t *bucket) {                \
        const double top = p->last - p->first, first = p->first, multiplier = p->multiplier;           \
        const float low = p->low;                                                                       \
        const int32_t side = p->side;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                               \
            const float v = (float)x[i], m = fabsf(v);                                                  \
            int32_t bits;                                                                               \
            memcpy(&bits, &m, sizeof bits);                                                             \
            double key = floor((double)bits * multiplier) - first;                                      \
            key = key < 0.0 ? 0.0 : key;                                                                \
            key = key > top ? top : key;                                                                \
            const int32_t k = (int32_t)key;                                                             \
            const int32_t signed_bucket = v > 0 ? side + 1 + k : side - 1 - k;                         \
            bucket[i] = m >= low ? signed_bucket : side;                                                \
        }                                                                                               \
    }

/* The moments, extreme keys, count above and NaN count of a block, in one vectorised loop. */
#define MOMENTS(NAME, T, K)                                                                             \
    static void NAME(const T *x, int64_t n, double shift, double threshold, double *sum, double *sumsq, \
                     K *l, K *h, int64_t *count, int64_t *nans) {                                       \
        double s = 0, q = 0;                                                                            \
        K lo = key_##T(x[0]), hi = lo;                                                                  \
        int64_t c = 0, z = 0;                                                                           \
        for (int64_t i = 0; i < n; i++) {                                                               \
            const T v = x[i];                                                                           \
            const double d = (double)v - shift;                                                         \
            const K k = key_##T(v);                                                                     \
            s += d;                                                                                     \
            q += d * d;                                                                                 \
            c += (double)v > threshold;                                                                 \
            z += v != v;                                                                                \
            lo = k < lo ? k : lo;                                                                       \
            hi = k > hi ? k : hi;                                                                       \
        }                                                                                               \
        *sum += s; *sumsq += q; *l = lo; *h = hi; *count += c; *nans = z;                               \
    }

/* The first position of `value` in the block starting at `start` (where the row's extreme was first met);
 * of a NaN where `value` is NaN. */
#define FIRST_AT(T)                                                                                     \
    static inline int64_t first_at_##T(const T *x, int64_t start, int64_t n, T value) {                 \
        int64_t i = start;                                                                              \
        if (value != value)                                                                             \
            while (i < n - 1 && x[i] == x[i]) i++;                                                      \
        else                                                                                            \
            while (i < n - 1 && x[i] != value) i++;                                                     \
        return i;                                                                                       \
    }

/* A row's statistics. Its extremes are PyTorch's max and min over the row: NaN where the row holds a
 * NaN (at the first NaN), else the extreme value at its first position. */
#define ROW(NAME, MOMENTS_OF, BUCKETS_OF, T, K)                                                        \
    static void NAME(const T *x, int64_t n, double shift, const units_params_t *p, int64_t *sketch,     \
                     double *s1, double *s2, int64_t *above, double *lo, double *hi, int64_t *at_lo,    \
                     int64_t *at_hi) {                                                                  \
        double sum = 0, sumsq = 0;                                                                      \
        K l = key_##T(x[0]), h = l;                                                                     \
        int64_t count = 0, lo_block = 0, hi_block = 0, nan_block = -1, small = 0;                       \
        int32_t bucket[BLOCK];                                                                          \
        for (int64_t start = 0; start < n; start += BLOCK) {                                            \
            const int64_t len = start + BLOCK < n ? BLOCK : n - start;                                  \
            const T *block = x + start;                                                                 \
            K block_lo, block_hi;                                                                       \
            int64_t nans;                                                                               \
            MOMENTS_OF(block, len, shift, p->threshold, &sum, &sumsq, &block_lo, &block_hi, &count, &nans); \
            if (nans && nan_block < 0) nan_block = start;                                               \
            if (block_lo < l) { l = block_lo; lo_block = start; }                                       \
            if (block_hi > h) { h = block_hi; hi_block = start; }                                       \
            BUCKETS_OF(block, len, p, bucket);                                                          \
            for (int64_t i = 0; i < len; i++) { /* the zero bucket's values are counted, not added */  \
                const int32_t b = bucket[i];                                                            \
                small += b == p->side;                                                                  \
                sketch[b] += b != p->side;                                                              \
            }                                                                                           \
        }                                                                                               \
        sketch[p->side] += small;                                                                       \
        *s1 += sum; *s2 += sumsq; *above += count;                                                      \
        if (nan_block >= 0) {                                                                           \
            *at_lo = *at_hi = first_at_##T(x, nan_block, n, NAN);                                       \
        } else { /* a zero extreme: the first zero of either sign, as the keys order -0.0 below 0.0 */   \
            const T row_lo = value_##T(l), row_hi = value_##T(h);                                       \
            *at_lo = first_at_##T(x, row_lo == 0 ? 0 : lo_block, n, row_lo);                           \
            *at_hi = first_at_##T(x, row_hi == 0 ? 0 : hi_block, n, row_hi);                            \
        }                                                                                               \
        *lo = x[*at_lo];                                                                                \
        *hi = x[*at_hi];                                                                                \
    }

FIRST_AT(float)
FIRST_AT(double)
BUCKETS(buckets_float, float)
BUCKETS(buckets_double, double)
MOMENTS(moments_float, float, int32_t)
MOMENTS(moments_double, double, int64_t)
ROW(row_float, moments_float, buckets_float, float, int32_t)
ROW(row_double, moments_double, buckets_double, double, int64_t)

void hr_units(const void *x, int is_double, int64_t batch, int64_t units, int64_t positions,
              const double *shift, double threshold, double low, double multiplier, int64_t first,
              int64_t last, int64_t side, int64_t *sketch, double *s1, double *s2, int64_t *above, double *lo,
              double *hi, int64_t *at_lo, int64_t *at_hi) {
    const units_params_t p = {threshold, multiplier, (float)low, (int32_t)first, (int32_t)last, (int32_t)side};
    const int64_t size = 2 * side + 1;
    /* Units apart on PyTorch's own OpenMP threads (torch loaded libgomp first, so this is its pool,
     * already awake after the layer's operator): a unit's sketch row and its (sample, unit) outputs
     * are written by one thread only. */
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < units; u++) {
        s1[u] = s2[u] = 0;
        above[u] = 0;
        for (int64_t b = 0; b < batch; b++) {
            const int64_t r = b * units + u;
            if (is_double)
                row_double((const double *)x + r * positions, positions, shift[u], &p, sketch + u * size,
                           s1 + u, s2 + u, above + u, lo + r, hi + r, at_lo + r, at_hi + r);
            else
                row_float((const float *)x + r * positions, positions, shift[u], &p, sketch + u * size,
                          s1 + u, s2 + u, above + u, lo + r, hi + r, at_lo + r, at_hi + r);
        }
    }
}
