/*
 * fxattn_grid.h (libfxattn): the cost model of context-parallel attention
 * (docs/cluster.md), which picks the U x R grid of fxattn_mpi.h.
 *
 * The model predicts the wall time of one distributed attention call on
 * every U x R grid of P ranks on N hosts, and of the all-gather
 * alternative (all-gather K and V, then local attention), from a rank's
 * compute rate and two links (between hosts, inside a host). Ranks are
 * placed on hosts in grid-rank order, P / N per host (fxa_mpi_placement's
 * default), so rows of U adjacent ranks (the Ulysses groups) stay inside a
 * host when U divides P / N.
 *
 * fxa_grid_cost and fxa_grid_best are pure arithmetic (no handle, no MPI,
 * no clock): errors go to the caller's err buffer. fxa_grid_measure times
 * attention on a context (its errors: fxa_ctx_last_error). Under MPI,
 * fxa_mpi_grid_plan (fxattn_mpi.h) measures a job's links and ranks and
 * picks the grid.
 */
#ifndef FXATTN_GRID_H
#define FXATTN_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One link. */
typedef struct fxa_grid_link {
    double latency_seconds;  /* per message */
    double bytes_per_second; /* out of one host (between hosts) or one rank (inside a host) */
    /* CPU seconds a rank spends per byte it sends or receives (copies and
     * protocol work: TCP costs this on the rank's own cores); a transfer
     * that overlaps compute slows it by that much. 0: free (offloaded). */
    double cpu_seconds_per_byte;
} fxa_grid_link;

/* Ring step rates at most (the divisors of at most 4096 ranks: 48 at most). */
#define FXA_GRID_MAX_STEP_RATES 64

/* What fxa_mpi_grid_plan measures (fxa_grid_model.measure, a bit set). A
 * link of a job that has none of its kind (one host: no link between
 * hosts; one rank per host: none inside) keeps the given figures. */
enum {
    FXA_GRID_MEASURE_INTER = 1,     /* latency and bandwidth between hosts */
    FXA_GRID_MEASURE_INTER_CPU = 2, /* CPU time per byte between hosts */
    FXA_GRID_MEASURE_INTRA = 4,     /* latency and bandwidth inside a host */
    FXA_GRID_MEASURE_INTRA_CPU = 8, /* CPU time per byte inside a host */
    FXA_GRID_MEASURE_COMPUTE = 16,  /* rank_flops and the ring step rates */
    FXA_GRID_MEASURE_CALL = 32,     /* call_seconds */
    FXA_GRID_MEASURE_ALL = 63,
    /* Set by fxa_mpi_grid_plan when the job's hosts run different numbers
     * of ranks (the model assumes P / N on each). */
    FXA_GRID_UNEVEN_HOSTS = 64
};

/* The model's inputs. Versioned (struct_size; new in 0.3). */
typedef struct fxa_grid_model {
    size_t struct_size;  /* sizeof(fxa_grid_model) */
    int64_t seq;         /* S: query and key tokens (self-attention) */
    int64_t heads;       /* H: query and kv heads */
    int64_t head_dim;    /* D */
    fxa_dtype dtype;     /* of the inputs: 4 bytes an element (f32) or 2 */
    int ranks;           /* P, in [1, 4096] (fxa_mpi_grid_plan: 0 = the job's) */
    int hosts;           /* N, divides P (fxa_mpi_grid_plan: 0 = the job's) */
    double rank_flops;   /* FLOP/s of one rank while every rank of its host computes */
    fxa_grid_link inter; /* between hosts */
    fxa_grid_link intra; /* between ranks of one host */
    /* Head groups of pure Ulysses (R == 1), in [1, 64], capped by a rank's
     * heads: group g + 1 travels while group g computes. 1: blocking
     * exchanges. With R > 1 the exchanges do not overlap (one group). */
    int ulysses_groups;
    /* Fixed seconds of one distributed call (its agreements and polled
     * waits); 0 when not measured. */
    double call_seconds;
    /* FXA_GRID_MEASURE_* bits: what fxa_mpi_grid_plan measures; on its
     * return, what it did measure (and FXA_GRID_UNEVEN_HOSTS). */
    unsigned measure;
    /* Optional rates at the shape of one ring step (ceil(S/R) queries
     * against as many keys, ceil(H/U) heads), which smaller blocks run more
     * slowly: step_flops[i] for grids with R = step_ring[i]; other grids
     * (and every grid when n_step_rates is 0) use rank_flops. */
    int n_step_rates;
    int step_ring[FXA_GRID_MAX_STEP_RATES];
    double step_flops[FXA_GRID_MAX_STEP_RATES];
} fxa_grid_model;

/* Defaults: S = H = D = 0 (to be set), f32, P = N = 0 (to be set, or the
 * job's under fxa_mpi_grid_plan), rank_flops
 * 0 (to be set or measured), between hosts 10 Gbit/s and 20 us, inside a
 * host 100 Gbit/s and 1 us, no CPU time per byte, 4 Ulysses head groups
 * (libfxattn_mpi's), call_seconds 0, measure FXA_GRID_MEASURE_ALL, no step
 * rates. Local. */
FXA_API void fxa_grid_model_init(fxa_grid_model *m);

/* The predicted time of one grid. Versioned (struct_size; new in 0.3). */
typedef struct fxa_grid_time {
    size_t struct_size;     /* set by the caller (sizeof); written within it only */
    int ulysses;            /* U (0 for the all-gather alternative) */
    int ring;               /* R (0 for the all-gather alternative) */
    double seconds;         /* predicted wall time of one call (the slowest rank) */
    double compute_seconds; /* attention arithmetic of one rank */
    double comm_seconds;    /* the rest: exposed transfers and latencies */
    double flops;           /* the compute rate it assumed (FLOP/s of one rank) */
} fxa_grid_time;

/* The U x R grid (U * R == m->ranks), or with U = R = 0 the all-gather
 * alternative, into *out. FXA_ERR_INVALID_ARG (why in err, cap bytes; err
 * may be NULL) for a model out of range (sizes not positive, P outside
 * [1, 4096], N not dividing P, rates not positive and finite, latencies,
 * CPU times or call_seconds negative or not finite, head groups outside
 * [1, 64]) or a grid that is not P's. */
FXA_API fxa_status fxa_grid_cost(const fxa_grid_model *m, int ulysses, int ring, fxa_grid_time *out,
                                 char *err, size_t cap);

/* The fastest U x R grid of m->ranks (the smaller U on ties) into *out;
 * errors as fxa_grid_cost. */
FXA_API fxa_status fxa_grid_best(const fxa_grid_model *m, fxa_grid_time *out, char *err,
                                 size_t cap);

/* Measure this process's compute rates on ctx (all its threads) with
 * m->dtype inputs: m->rank_flops at the all-gather shape (the first
 * ceil(S / P) queries against every key, S capped at 8192) and, for every
 * divisor R of m->ranks, step_flops at the ring step shape (ceil(S/R)
 * queries against as many keys, capped at 8192); each the median of 5
 * runs after a warm-up, with as many of m's heads as make about 1 GFLOP,
 * on synthetic Gaussian inputs. The rates are the whole process's: a
 * caller whose host runs n ranks at once divides them by n. Errors:
 * fxa_ctx_last_error(ctx). */
FXA_API fxa_status fxa_grid_measure(fxa_ctx *ctx, fxa_grid_model *m);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_GRID_H */
