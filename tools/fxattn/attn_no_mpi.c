/* `fxattn attn --ulysses/--ring` in a build without MPI (FXA_WITH_MPI=OFF). */
#include "attn_opts.h"
#include "cli.h"

int fxt_attn_mpi(const attn_opts *o)
{
    (void)o;
    return fxt_fail(FXT_EXIT_BAD_INPUT,
                    "this fxattn was built without MPI (FXA_WITH_MPI=OFF): --ulysses, --ring "
                    "and mpirun need an MPI build");
}
