/* One pass over a batch of layer outputs for every per-unit statistic of hooks.unit_stats.
 *
 * Built and loaded by hooks/native.py like stats_kernel.c, with OpenMP; called through ctypes (the
 * GIL is released); the units are split over PyTorch's OpenMP threads.
 *
 * The input is [batch, units, positions], contiguous, float32 or float64: one row per (sample,
 * unit), its positions (pixels, tokens) next to each other. Per row it writes the sum and the sum
 * of squares of (value - shift[unit]) accumulated in double (shift: the unit's running mean, so
 * the caller's M2 = S2 - S1^2 / n does not cancel), min and max with the first position of each,
 * and the count above the threshold; it adds each value's quantile-sketch bucket to sketch[unit].
 *
 * The sketch bucket: k = ceil(log_gamma(|v|)) clamped to [first, last], i.e. |v| in
 * (gamma^(k-1), gamma^k], read against the caller's table upper[k - first] = gamma^k in double.
 * A cheap vectorised estimate of log2 (a polynomial on the float's mantissa, off by < 3e-4, far
 * less than a bucket's width) gives a first k, which one or two comparisons against the table
 * correct: the buckets are those of the definition, not of the estimate. NaN counts in the zero bucket.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 256

typedef struct {
    double threshold, low, inv_log2_gamma;
    int64_t first, last, side, size;
    const double *upper;
    int fine; /* buckets narrower than the log2 estimate's error: keys need walking */
} units_params_t;

static inline float log2_estimate(float m) {
    int32_t bits;
    memcpy(&bits, &m, sizeof bits);
    const float e = (float)((bits >> 23) - 127);
    bits = (bits & 0x007fffff) | 0x3f800000;
    float f;
    memcpy(&f, &bits, sizeof f);
    const float t = f - 1.0f;
    return e + 2.04158914e-04f + t * (1.43609808f + t * (-0.669515210f + t * (0.312214266f + t * -0.0791503658f)));
}

/* The log2 estimate of a block's magnitudes in key units, vectorised (gathers from the table are not:
 * the compiler declines them on some CPUs, so the correction runs in the scatter loop). */
#define ESTIMATES(NAME, T)                                                                              \
    static void NAME(const T *x, int64_t n, float scale, float *estimate) {                            \
        for (int64_t i = 0; i < n; i++) {                                                               \
            const float m = fabsf((float)x[i]);                                                         \
            estimate[i] = log2_estimate(m > 1e-30f ? m : 1e-30f) * scale;                               \
        }                                                                                               \
    }

/* The sketch key (k - first) of magnitude m >= low from its estimate, corrected one step each way
 * against the table (the estimate is off by less than a bucket for relative errors above 3e-4; finer
 * sketches walk); upper[-1] is the caller's sentinel 0 (and upper[last - first + 1] infinity). */
static inline int64_t key_of(double m, float estimate, const units_params_t *p) {
    const double *upper = p->upper;
    int64_t k = (int64_t)fminf(fmaxf(ceilf(estimate), (float)p->first), (float)p->last) - p->first;
    k -= m <= upper[k - 1];
    k += (m > upper[k]) & (k < p->last - p->first); /* above the last edge: the last bucket, as defined */
    if (p->fine) {
        while (k > 0 && m <= upper[k - 1]) k--;
        while (k < p->last - p->first && m > upper[k]) k++;
    }
    return k;
}

ESTIMATES(estimates_float, float)
ESTIMATES(estimates_double, double)

/* The moments, extremes and count above of a block, vectorised: the compiler may assume no NaN here
 * (that is what lets it vectorise min and max); a NaN gives undefined extremes, never a bad index. */
#define MOMENTS(NAME, T)                                                                                \
    __attribute__((optimize("finite-math-only")))                                                      \
    static void NAME(const T *x, int64_t n, double shift, double threshold, double *sum, double *sumsq, \
                     T *l, T *h, int64_t *count) {                                                      \
        double s = 0, q = 0;                                                                            \
        T lo = *l, hi = *h;                                                                             \
        int64_t c = 0;                                                                                  \
        for (int64_t i = 0; i < n; i++) {                                                               \
            const T v = x[i];                                                                           \
            const double d = (double)v - shift;                                                         \
            s += d;                                                                                     \
            q += d * d;                                                                                 \
            c += (double)v > threshold;                                                                 \
            lo = v < lo ? v : lo;                                                                       \
            hi = v > hi ? v : hi;                                                                       \
        }                                                                                               \
        *sum += s; *sumsq += q; *l = lo; *h = hi; *count += c;                                          \
    }

#define ROW(NAME, MOMENTS_OF, ESTIMATES_OF, T)                                                                        \
    static void NAME(const T *x, int64_t n, double shift, const units_params_t *p, int64_t *sketch,     \
                     double *s1, double *s2, double *lo, double *hi, int64_t *above, int64_t *at_lo,    \
                     int64_t *at_hi) {                                                                  \
        double sum = 0, sumsq = 0;                                                                      \
        T l = x[0], h = x[0];                                                                           \
        int64_t count = 0;                                                                              \
        float estimate[BLOCK];                                                                          \
        int32_t big[BLOCK];                                                                             \
        int64_t small = 0;                                                                              \
        for (int64_t start = 0; start < n; start += BLOCK) {                                            \
            const int64_t len = start + BLOCK < n ? BLOCK : n - start;                                  \
            const T *block = x + start;                                                                 \
            MOMENTS_OF(block, len, shift, p->threshold, &sum, &sumsq, &l, &h, &count);                  \
            ESTIMATES_OF(block, len, (float)p->inv_log2_gamma, estimate);                               \
            int64_t n_big = 0; /* the zero bucket's values are counted, not scattered */                \
            for (int64_t i = 0; i < len; i++) {                                                         \
                big[n_big] = (int32_t)i;                                                                \
                n_big += fabs((double)block[i]) >= p->low;                                              \
            }                                                                                           \
            small += len - n_big;                                                                       \
            for (int64_t j = 0; j < n_big; j++) {                                                       \
                const int32_t i = big[j];                                                               \
                const double v = block[i];                                                              \
                const int64_t k = key_of(fabs(v), estimate[i], p);                                      \
                sketch[v > 0 ? p->side + 1 + k : p->side - 1 - k] += 1;                                \
            }                                                                                           \
        }                                                                                               \
        sketch[p->side] += small;                                                                       \
        int64_t i_lo = 0, i_hi = 0;                                                                     \
        while (i_lo < n - 1 && x[i_lo] != l) i_lo++;                                                    \
        while (i_hi < n - 1 && x[i_hi] != h) i_hi++;                                                    \
        *s1 = sum; *s2 = sumsq; *lo = l; *hi = h; *above = count; *at_lo = i_lo; *at_hi = i_hi;         \
    }

MOMENTS(moments_float, float)
MOMENTS(moments_double, double)
ROW(row_float, moments_float, estimates_float, float)
ROW(row_double, moments_double, estimates_double, double)

void hr_units(const void *x, int is_double, int64_t batch, int64_t units, int64_t positions,
              const double *shift, double threshold, double low, double inv_log2_gamma, int64_t first,
              int64_t last, int64_t side, int64_t size, const double *upper, int64_t *sketch, double *s1,
              double *s2, double *lo, double *hi, int64_t *above, int64_t *at_lo, int64_t *at_hi) {
    const units_params_t p = {threshold, low, inv_log2_gamma, first, last, side, size, upper,
                             inv_log2_gamma > 1000};
    /* Units apart on PyTorch's own OpenMP threads (torch loaded libgomp first, so this is its pool,
     * already awake after the layer's operator): a unit's sketch row and its (sample, unit) outputs
     * are written by one thread only. */
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < units; u++) {
        for (int64_t b = 0; b < batch; b++) {
            const int64_t r = b * units + u;
            if (is_double)
                row_double((const double *)x + r * positions, positions, shift[u], &p, sketch + u * size,
                           s1 + r, s2 + r, lo + r, hi + r, above + r, at_lo + r, at_hi + r);
            else
                row_float((const float *)x + r * positions, positions, shift[u], &p, sketch + u * size,
                          s1 + r, s2 + r, lo + r, hi + r, above + r, at_lo + r, at_hi + r);
        }
    }
}
