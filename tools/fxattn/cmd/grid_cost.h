/*
 * The cost model of context-parallel attention (docs/cluster.md): the
 * predicted time of one distributed attention call on every U x R grid of P
 * ranks on N hosts, and of the all-gather alternative (all-gather K and V,
 * then local attention), from a rank's compute rate and two links (between
 * hosts, inside a host). Ranks are placed on hosts in rank order, P / N per
 * host (mpirun's --map-by slot), so rows of U adjacent ranks (the Ulysses
 * groups) stay inside a host when U divides P / N. Pure arithmetic: no MPI,
 * no clock.
 */
#ifndef FXT_GRID_COST_H
#define FXT_GRID_COST_H

#include <stddef.h>
#include <stdint.h>

typedef struct fxt_link {
    double latency;   /* seconds per message */
    double bandwidth; /* bytes per second out of one host (inter) or one rank (intra) */
    /* CPU seconds a rank spends per byte it sends or receives (copies and
     * protocol work: TCP costs this on the rank's own cores); a transfer
     * that overlaps compute slows it by that much. 0: free (offloaded). */
    double cpu_per_byte;
} fxt_link;

#define FXT_MAX_STEP_RATES 64 /* divisors of at most 4096 ranks: 48 at most */

typedef struct fxt_cost_model {
    int64_t seq;       /* S: query and key tokens (self-attention) */
    int64_t heads;     /* H: query and kv heads */
    int64_t dim;       /* D */
    double elem_bytes; /* bytes of an input element (4 fp32, 2 bf16 / f16) */
    int ranks;         /* P */
    int hosts;         /* N, divides P */
    double rank_flops; /* FLOP/s of one rank while every rank of its host computes */
    /* Optional rates at the shape of one ring step (ceil(S/R) queries against
     * as many keys, ceil(H/U) heads), which smaller blocks run more slowly:
     * step_flops[i] for grids with R = step_ring[i]; other grids (and every
     * grid when n_step_rates is 0) use rank_flops. */
    int n_step_rates;
    int step_ring[FXT_MAX_STEP_RATES];
    double step_flops[FXT_MAX_STEP_RATES];
    fxt_link inter; /* between hosts */
    fxt_link intra; /* between ranks of one host */
    /* Head groups of pure Ulysses (R == 1), in [1, 64], capped by a rank's
     * heads: group g + 1 travels while group g computes. 1: blocking
     * exchanges (forward, compute, back). With R > 1 the exchanges do not
     * overlap (one group). */
    int ulysses_groups;
    /* Fixed seconds of one distributed call (its agreements and polled
     * waits), measured by a small run under mpirun; 0 when not measured. */
    double call_seconds;
} fxt_cost_model;

typedef struct fxt_grid_time {
    int ulysses;            /* U (0 for the all-gather alternative) */
    int ring;               /* R (0 for the all-gather alternative) */
    double seconds;         /* predicted wall time of one call (the slowest rank) */
    double compute_seconds; /* attention arithmetic of one rank */
    double comm_seconds;    /* the rest: exposed transfers and latencies */
    double flops;           /* the compute rate it assumed (FLOP/s of one rank) */
} fxt_grid_time;

/* 0 when m is usable, else 1 with the reason in err ("--hosts 3 does not
 * divide --ranks 4", ...). */
int fxt_cost_model_check(const fxt_cost_model *m, char *err, size_t cap);

/* The U x R grid (U * R == m->ranks) and the all-gather alternative. m must
 * pass fxt_cost_model_check. */
fxt_grid_time fxt_grid_cost(const fxt_cost_model *m, int ulysses, int ring);
fxt_grid_time fxt_allgather_cost(const fxt_cost_model *m);

/* Every U x R grid of m->ranks, U ascending, into out (cap entries);
 * returns how many, and *best the index of the fastest (the smaller U on
 * ties). */
int fxt_grid_plan(const fxt_cost_model *m, fxt_grid_time *out, int cap, int *best);

/* 1 when every Ulysses row of U ranks lies on one host. */
int fxt_grid_rows_in_host(const fxt_cost_model *m, int ulysses);

#endif
