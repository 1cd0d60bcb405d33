/* Min and max of floats as integer keys, for the kernels of hooks/native.py.
 *
 * A float min or max reduction vectorises only where the compiler may assume no NaN, and the
 * kernels assume nothing of the kind: every NaN and Inf is seen, as in PyTorch. Integer min and
 * max vectorise. A float's key is its bit pattern with the magnitude bits flipped for negative
 * values, so keys order as the values do, -0.0 just below 0.0 and a NaN's key beyond an
 * infinity's: a caller counts NaNs apart (v != v) and decides what a NaN makes of its extremes.
 */
#include <stdint.h>
#include <string.h>

static inline int32_t key_float(float v) {
    int32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits ^ ((bits >> 31) & INT32_MAX);
}

static inline int64_t key_double(double v) {
    int64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits ^ ((bits >> 63) & INT64_MAX);
}

static inline float value_float(int32_t key) {
    const int32_t bits = key ^ ((key >> 31) & INT32_MAX);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline double value_double(int64_t key) {
    const int64_t bits = key ^ ((key >> 63) & INT64_MAX);
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}
