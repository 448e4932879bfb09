/*
 * The throughput loop of a peak measurement (peak.c), written once for every ISA: PEAK_ACC
 * independent accumulator chains, c = PEAK_STEP(c, a, b) per chain and iteration, started at
 * distinct values (b, 2b, ...: so that the compiler cannot merge identical chains), then summed
 * into one vector. Included once per loop (no include guard), after defining:
 *   PEAK_NAME            the static function to define: peak_vec PEAK_NAME(iters, a, b, b0)
 *   PEAK_STEP(c, a, b)   one instruction of the measured kind
 *   PEAK_ACC, peak_vec, peak_set1(x), peak_add(x, y)   (once per file)
 * The chains stay in registers: every loop over them is unrolled whole.
 */
#ifndef PEAK_UNROLL
#define PEAK_UNROLL _Pragma("GCC unroll 16")
#endif

static peak_vec PEAK_NAME(uint64_t iters, peak_vec a, peak_vec b, float b0)
{
    peak_vec c[PEAK_ACC];
    PEAK_UNROLL
    for (int j = 0; j < PEAK_ACC; j++)
        c[j] = peak_set1(b0 * (float)(j + 1));
    for (uint64_t i = 0; i < iters; i++) {
        PEAK_UNROLL
        for (int j = 0; j < PEAK_ACC; j++)
            c[j] = PEAK_STEP(c[j], a, b);
    }
    PEAK_UNROLL
    for (int j = 1; j < PEAK_ACC; j++)
        c[0] = peak_add(c[0], c[j]);
    return c[0];
}

#undef PEAK_NAME
#undef PEAK_STEP
