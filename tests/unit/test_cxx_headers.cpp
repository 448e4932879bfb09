// Every public header from C++: compiled as C++17 and linked against the
// static libraries, so that a header without extern "C" (C++ name
// mangling) or with C-only syntax fails this test's build or link. One
// function of each header is called and its result checked.
#include <cstdio>
#include <cstring>

#include "fxattn.h"
#include "fxattn_checkpoint.h"
#include "fxattn_diag.h"
#include "fxattn_grid.h"
#include "fxattn_npy.h"
#include "fxattn_proj.h"
#include "fxattn_safetensors.h"
#include "fxattn_wan.h"
#ifdef FXA_TEST_MPI_HEADERS
#include "fxattn_mpi.h"
#include "fxattn_wan_mpi.h"
#endif

static int failures = 0;

static void check(bool ok, const char *what)
{
    if (!ok) {
        std::fprintf(stderr, "test_cxx_headers: %s\n", what);
        failures++;
    }
}

int main()
{
    check(std::strcmp(fxa_status_str(FXA_ERR_IO), fxa_status_str(FXA_OK)) != 0, "fxattn.h");
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    check(cd.struct_size == sizeof cd, "fxattn_diag.h");
    fxa_grid_model gm;
    fxa_grid_model_init(&gm);
    check(gm.struct_size == sizeof gm, "fxattn_grid.h");
    check(fxa_e4m3_to_f32(0x38) == 1.0f, "fxattn_proj.h: e4m3 0x38 is 1");
    fxa_wan_load_params lp;
    fxa_wan_load_params_init(&lp);
    check(lp.struct_size == sizeof lp, "fxattn_wan.h");
    check(fxa_same_output(nullptr, "x.npy") == 0, "fxattn_npy.h");
    fxa_st_close(nullptr);
    fxa_ckpt_close(nullptr);
    check(FXA_ST_F8_E4M3 == 3, "fxattn_safetensors.h: explicit enum values");
#ifdef FXA_TEST_MPI_HEADERS
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    check(mp.struct_size == sizeof mp && mp.placement == FXA_MPI_PLACE_HOSTS, "fxattn_mpi.h");
    fxa_wan_grid g;
    fxa_wan_grid_init(&g);
    check(g.struct_size == sizeof g, "fxattn_wan_mpi.h");
#endif
    std::printf("test_cxx_headers: %s\n", failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}
