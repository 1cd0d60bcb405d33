/* One pass over a contiguous float32 or float64 tensor for every statistic of hooks.stats.RAW.
 *
 * Built by hooks/native.py with the machine's C compiler; called through ctypes, which releases
 * the GIL. It runs on the calling thread (hooks/native.py says why not on more).
 *
 * Every sum is accumulated in double (float32 elements are widened in registers: as fast, the
 * loop is bound by memory, and as exact as PyTorch's float64 sum); the compiler vectorises the
 * loop because the build allows reassociation, never finite-math, so NaN and Inf compare as IEEE
 * says. Sums run around `shift` (the first element when finite, else 0), so the variance of data
 * whose mean dwarfs its spread does not cancel. Block sums (BLOCK elements) are added to the
 * chunk's total, which keeps rounding from growing with the tensor's length. A NaN anywhere
 * makes min and max NaN, as torch.aminmax gives.
 */
#include <math.h>
#include <stdint.h>

#define BLOCK 512

typedef struct {
    const void *data;
    int64_t n;
    double shift;
    double sum, sumsq, abs_sum, lo, hi;
    int64_t zeros, nans, infs;
} chunk_t;

/* min and max of one block, which the sum loop has just brought into L1. IEEE min/max cannot be
 * vectorised (a NaN must win); here the compiler may assume no NaN, so it vectorises, and what it
 * gives for NaN does not matter: the caller replaces both by NaN when nan_count > 0. */
#define MINMAX(NAME, T)                                                               \
    __attribute__((optimize("finite-math-only")))                                    \
    static void NAME(const T *x, int64_t n, T *lo, T *hi) {                          \
        T l = *lo, h = *hi;                                                          \
        for (int64_t i = 0; i < n; i++) {                                            \
            l = x[i] < l ? x[i] : l;                                                 \
            h = x[i] > h ? x[i] : h;                                                 \
        }                                                                            \
        *lo = l;                                                                     \
        *hi = h;                                                                     \
    }

/* The whole tensor: per block, the sums and counts (vectorised), then the block's min and max. */
#define REDUCE(NAME, MINMAX_NAME, T, A, ABS)                                           \
    static void *NAME(void *arg) {                                                   \
        chunk_t *c = (chunk_t *)arg;                                                 \
        const T *x = (const T *)c->data;                                             \
        const A shift = (A)c->shift;                                                 \
        double sum = 0, sumsq = 0, abs_sum = 0;                                      \
        T lo = x[0], hi = x[0];                                                      \
        int64_t zeros = 0, nans = 0, infs = 0;                                       \
        for (int64_t start = 0; start < c->n; start += BLOCK) {                      \
            const int64_t stop = c->n - start < BLOCK ? c->n : start + BLOCK;        \
            A bsum = 0, bsumsq = 0, babs = 0;                                        \
            int32_t bz = 0, bn = 0, bi = 0;                                          \
            for (int64_t i = start; i < stop; i++) {                                 \
                const T v = x[i];                                                    \
                const A d = (A)v - shift;                                            \
                const A a = ABS((A)v);                                               \
                bsum += d;                                                           \
                bsumsq += d * d;                                                     \
                babs += a;                                                           \
                bz += v == 0;                                                        \
                bn += v != v;                                                        \
                bi += a == (A)INFINITY;                                              \
            }                                                                        \
            MINMAX_NAME(x + start, stop - start, &lo, &hi);                          \
            sum += bsum;                                                             \
            sumsq += bsumsq;                                                         \
            abs_sum += babs;                                                         \
            zeros += bz;                                                             \
            nans += bn;                                                              \
            infs += bi;                                                              \
        }                                                                            \
        c->sum = sum;                                                                \
        c->sumsq = sumsq;                                                            \
        c->abs_sum = abs_sum;                                                        \
        c->lo = lo;                                                                  \
        c->hi = hi;                                                                  \
        c->zeros = zeros;                                                            \
        c->nans = nans;                                                              \
        c->infs = infs;                                                              \
        return 0;                                                                    \
    }

MINMAX(minmax_f32, float)
MINMAX(minmax_f64, double)
REDUCE(reduce_f32, minmax_f32, float, double, fabs)
REDUCE(reduce_f64, minmax_f64, double, double, fabs)

/* hooks.stats.RAW of the n > 0 elements at x (float64 if is_double, else float32) into out[9]. */
void hr_reduce(const void *x, int64_t n, int is_double, double *out) {
    const double first = is_double ? ((const double *)x)[0] : ((const float *)x)[0];
    chunk_t c = {.data = x, .n = n, .shift = isfinite(first) ? first : 0.0};
    if (is_double)
        reduce_f64(&c);
    else
        reduce_f32(&c);
    out[0] = c.sum;
    out[1] = c.sumsq;
    out[2] = c.abs_sum;
    out[3] = c.nans ? NAN : c.lo;
    out[4] = c.nans ? NAN : c.hi;
    out[5] = (double)c.zeros;
    out[6] = (double)c.nans;
    out[7] = (double)c.infs;
    out[8] = c.shift;
}
