/* The distributed subcommands in a build without MPI (FXA_WITH_MPI=OFF). */
#include "attn_opts.h"
#include "bench_opts.h"
#include "cli.h"
#include "layer.h"
#include "plan.h"

static int no_mpi(void)
{
    return fxt_fail(FXT_EXIT_BAD_INPUT,
                    "this fxattn was built without MPI (FXA_WITH_MPI=OFF): --ulysses, --ring, "
                    "--prefetch, --tp and mpirun need an MPI build");
}

int fxt_attn_mpi(const attn_opts *o)
{
    (void)o;
    return no_mpi();
}

int fxt_bench_mpi(const bench_opts *o)
{
    (void)o;
    return no_mpi();
}

int fxt_plan_mpi(const plan_opts *o)
{
    (void)o;
    return no_mpi();
}

int fxt_layer_mpi(const layer_opts *o)
{
    (void)o;
    return no_mpi();
}
