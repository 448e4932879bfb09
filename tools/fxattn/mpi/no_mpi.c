/* The distributed subcommands in a build without MPI (FXA_WITH_MPI=OFF),
 * and in fxattn-nompi (FXT_NO_MPI_RUNTIME): the CLI the Python package runs
 * where Open MPI's runtime is not installed. */
#include "attn_opts.h"
#include "bench_opts.h"
#include "cli.h"
#include "layer.h"
#include "plan.h"

static int no_mpi(void)
{
#ifdef FXT_NO_MPI_RUNTIME
    return fxt_fail(FXT_EXIT_BAD_INPUT,
                    "--ulysses, --ring, --prefetch, --tp and mpirun need Open MPI's runtime "
                    "(libmpi.so.40), which this machine does not have: install it with "
                    "`apt-get install openmpi-bin libopenmpi3` (Debian, Ubuntu)");
#else
    return fxt_fail(FXT_EXIT_BAD_INPUT,
                    "this fxattn was built without MPI (FXA_WITH_MPI=OFF): --ulysses, --ring, "
                    "--prefetch, --tp and mpirun need an MPI build");
#endif
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
