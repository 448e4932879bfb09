/*
 * The option tables of the fxattn subcommands, one per command over an
 * options struct that holds exactly what fxt_parse_options writes (raw
 * strings, integers, doubles and flags; the commands validate and convert
 * them afterwards). The commands and tests/fuzz/fuzz_args.c both use these,
 * so the fuzzer always sees the tables the CLI parses with.
 *
 * Contract: fxt_X_opts_defaults sets every field to the value the command
 * starts from; fxt_X_opts_table fills t with the command's table (names,
 * aliases, kinds, ranges) pointing into o, zero-terminated, at most
 * FXT_MAX_OPTS entries including the terminator. o must outlive t.
 * fxt_X_opts_parse does both and parses the command's argv[2..] into o:
 * 0, or the exit code after printing why (fxt_parse_options).
 */
#ifndef FXT_CMD_OPTS_H
#define FXT_CMD_OPTS_H

#include <stdint.h>

#include "cli.h"
#include "cp_opts.h"

#define FXT_MAX_OPTS 32     /* entries of a table, the zeroed terminator included */
#define FXT_MAX_REPEATS 101 /* largest --repeats of attn and bench */

/* -q -k -v --layout --dtype --scale --threads: the attention inputs, how to read them, and the
 * threads (attn, check). */
typedef struct fxt_qkv_opts {
    const char *q;
    const char *k;
    const char *v;
    const char *layout;
    const char *dtype;
    double scale; /* NaN: not given */
    int64_t threads;
} fxt_qkv_opts;

/* The files and layout of o: 0 when -q and -k (and -v where need_v) are given and --layout
 * names a layout (into *layout); else FXT_EXIT_BAD_INPUT after the message `usage` (a file
 * missing) or the layout's. */
int fxt_qkv_opts_layout(const fxt_qkv_opts *o, int need_v, const char *usage, fxa_layout *layout);

/* Its defaults, and its option table rows in o (an fxt_qkv_opts), for a command's table. */
#define FXT_QKV_OPTS_DEFAULTS                                                                      \
    {                                                                                              \
        .layout = "bshd", .scale = NAN                                                             \
    }
#define FXT_QKV_OPTS_ROWS(o)                                                                       \
    {"-q", "--q", FXT_OPT_STRING, &(o).q, 0, 0}, {"-k", "--k", FXT_OPT_STRING, &(o).k, 0, 0},      \
        {"-v", "--v", FXT_OPT_STRING, &(o).v, 0, 0},                                               \
        {"--layout", NULL, FXT_OPT_STRING, &(o).layout, 0, 0},                                     \
        {"--dtype", NULL, FXT_OPT_STRING, &(o).dtype, 0, 0},                                       \
        {"--scale", NULL, FXT_OPT_DOUBLE, &(o).scale, 0, 0},                                       \
    {                                                                                              \
        "--threads", NULL, FXT_OPT_INT, &(o).threads, 0, 1024                                      \
    }

/* `fxattn attn` (also read by attn_mpi.c through attn_opts.h). */
typedef struct attn_opts {
    fxt_qkv_opts in;
    const char *out;
    const char *lse;
    const char *mode;
    const char *center;
    const char *compute;
    int64_t heads_per_tile;
    int64_t block_q;
    int64_t repeats;
    int stats;
    int verify;
    int reproducible; /* --reproducible: the same bytes on every grid */
    fxt_cp_opts cp;
    const char *placement; /* --placement hosts|ranks under mpirun; NULL: hosts */
    const char *inputs_on; /* --inputs-on all|rank0 under mpirun; NULL: all */
} attn_opts;

/* `fxattn check`. */
typedef struct check_opts {
    fxt_qkv_opts in;
    int json;
} check_opts;

/* `fxattn bench`, as parsed; cmd_bench.c converts it to bench_opts. */
typedef struct bench_args {
    int64_t seq;
    int64_t seq_kv; /* --seq-kv: keys (cross-attention); 0: --seq */
    int64_t heads;
    int64_t dim;
    const char *dtype_s;
    const char *compute_s; /* NULL: follows the dtype */
    int64_t threads;
    int64_t repeats;
    int json;
    int proj;     /* --proj: the QKV projection instead of attention */
    int backward; /* --backward: the attention backward beside the forward */
    int causal;   /* --causal: causal attention beside unmasked */
    fxt_cp_opts cp;
} bench_args;

/* `fxattn demo`. */
typedef struct demo_opts {
    int64_t frames;
    int64_t height;
    int64_t width;
    int64_t heads;
    int64_t dim;
    int64_t seed;
    int64_t threads;
    int json;
    const char *save_dir;
} demo_opts;

/* `fxattn layer` (also read by layer_mpi.c through layer.h). */
typedef struct layer_opts {
    const char *x;           /* -x X.npy; NULL: synthetic from --seed */
    const char *out;         /* -o Y.npy; NULL: nothing written */
    const char *weights;     /* --weights CKPT (file, index.json or folder); NULL: synthetic */
    const char *grid;        /* --grid F,H,W; NULL: 4,32,32 (synthetic x only) */
    const char *rope_layout; /* "interleaved" (Wan checkpoints) or "half" */
    const char *dtype;       /* "f32" or "bf16": the layer's activations (and weights) */
    const char *cp_grid;     /* --cp-grid auto: the planner picks --ulysses x --ring */
    int64_t block;
    int64_t heads;
    int64_t dim; /* 0: not given (hidden / heads, or 128 without files) */
    int64_t seed;
    int64_t threads;
    int fp8;
    int stats;
    int verify;
    int64_t ulysses; /* 0: not given */
    int64_t ring;
    int64_t tp;
    double timeout; /* --timeout seconds under mpirun; 0: not given */
} layer_opts;

/* `fxattn plan` (cmd_plan.c). NaN: not given. */
typedef struct plan_opts {
    int64_t seq;
    int64_t heads;
    int64_t dim;
    const char *dtype;
    int64_t ranks; /* 0: not given (the job's size under --measure) */
    int64_t hosts; /* 0: not given (1, or the job's hosts under --measure) */
    double link_gbps;
    double latency_us;
    double intra_gbps;
    double intra_latency_us;
    double link_cpu_us_per_mb;  /* CPU us a rank spends per MB sent or received between hosts */
    double intra_cpu_us_per_mb; /* the same inside a host */
    double gflops;              /* one host's compute rate, all its cores */
    int64_t ulysses_groups;
    int64_t threads; /* threads of the compute measurement (per rank under --measure) */
    int json;
    int measure; /* --measure under mpirun: ping-pong and per-rank compute */
} plan_opts;

/* `fxattn info`. */
typedef struct info_opts {
    int64_t threads;
} info_opts;

/* Each options struct's functions (the contract above): fxt_<type>_defaults, fxt_<type>_table
 * and fxt_<type>_parse. */
#define FXT_OPTS_FUNCTIONS(type)                                                                   \
    void fxt_##type##_defaults(type *o);                                                           \
    void fxt_##type##_table(type *o, fxt_opt t[FXT_MAX_OPTS]);                                     \
    int fxt_##type##_parse(int argc, char **argv, type *o)

FXT_OPTS_FUNCTIONS(attn_opts);
FXT_OPTS_FUNCTIONS(check_opts);
FXT_OPTS_FUNCTIONS(bench_args);
FXT_OPTS_FUNCTIONS(demo_opts);
FXT_OPTS_FUNCTIONS(layer_opts);
FXT_OPTS_FUNCTIONS(plan_opts);
FXT_OPTS_FUNCTIONS(info_opts);

#endif
