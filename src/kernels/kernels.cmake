# The kernels of libfxattn (included from src/CMakeLists.txt): the portable
# reference set, and on x86-64 the AVX2 and AVX-512 sets with ISA flags per
# file, never a global -march, so the build runs on any x86-64 and dispatch
# picks what the CPU has at run time. The kernels_<isa>.c files (the sets'
# init functions) take no ISA flags: dispatch builds every set on any CPU.
set(k ${CMAKE_CURRENT_SOURCE_DIR}/kernels)

# Kernel sources of libfxattn, each compiled with the options `flags` (a list; "" for none),
# and listed in the global property FXA_KERNEL_SOURCES.
function(fxa_kernel_sources flags)
  foreach(f ${ARGN})
    target_sources(fxattn_obj PRIVATE ${k}/${f})
    set_property(GLOBAL APPEND PROPERTY FXA_KERNEL_SOURCES ${k}/${f})
    if(flags)
      set_source_files_properties(${k}/${f} PROPERTIES COMPILE_OPTIONS "${flags}")
    endif()
  endforeach()
endfunction()

fxa_kernel_sources("" dispatch.c ref/kernels_ref.c ref/f32_tile_ref.c ref/bf16_tile_ref.c
                   ref/f32_packkt_ref.c ref/f16_widen_ref.c ref/f32_bwd_ref.c
                   ref/bf16_bwd_ref.c)
# The row statistics (one portable source per ISA) and the fp64 kernels: no contraction, so
# every build gives the reference's bits.
fxa_kernel_sources("-ffp-contract=off" ref/f32_rowstats_ref.c ref/f64_tile_ref.c
                   ref/f64_bwd_ref.c)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  set(FXA_AVX2 "-mavx2")
  set(FXA_AVX512 "-mavx512f;-mavx512vl;-mavx512bw;-mavx512dq")
  fxa_kernel_sources("" x86_avx2/kernels_avx2.c x86_avx512/kernels_avx512.c)
  fxa_kernel_sources("${FXA_AVX2};-mfma;-mf16c" f16_widen_f16c.c x86_avx2/f32_tile_4x24_6x16_avx2.c)
  fxa_kernel_sources("${FXA_AVX2};-mfma" x86_avx2/f32_bwd_6x16_avx2.c)
  fxa_kernel_sources("${FXA_AVX2}" x86_avx2/f32_packkt_8x8_avx2.c)
  fxa_kernel_sources("${FXA_AVX2};-ffp-contract=off" x86_avx2/f32_rowstats_avx2.c)
  fxa_kernel_sources("${FXA_AVX512};-mfma" x86_avx512/f32_tile_6x64_avx512.c
                    x86_avx512/f32_bwd_6x64_avx512.c)
  fxa_kernel_sources("${FXA_AVX512};-mavx512bf16;-mfma" x86_avx512/bf16_tile_6x64_avx512bf16.c
                    x86_avx512/bf16_bwd_6x64_avx512bf16.c)
  fxa_kernel_sources("${FXA_AVX512}" x86_avx512/f32_packkt_16x16_avx512.c)
  fxa_kernel_sources("${FXA_AVX512};-ffp-contract=off" x86_avx512/f32_rowstats_avx512.c)
  # The AMX tile needs a compiler with AMX intrinsics (GCC 11, clang 12);
  # without one the `amx` set is simply not built (dispatch says so).
  include(CheckCCompilerFlag)
  check_c_compiler_flag("-mamx-tile -mamx-bf16" FXA_CC_HAS_AMX)
  if(FXA_CC_HAS_AMX)
    fxa_kernel_sources("${FXA_AVX512};-mavx512bf16;-mfma;-mamx-tile;-mamx-bf16"
                       x86_avx512/bf16_tile_16x32_amx.c)
    target_compile_definitions(fxattn_obj PRIVATE FXA_HAVE_AMX_KERNELS)
  endif()
  target_compile_definitions(fxattn_obj PRIVATE FXA_HAVE_X86_KERNELS)
endif()

# For the test suite: every kernel source again, with the optimisation flags of a Release build
# (CMAKE_C_FLAGS_RELEASE, what users build) after those of the configuration in use, the same
# per-file ISA flags and libfxattn's definitions. Tests link these objects ahead of
# libfxattn.a, whose own kernels they replace (tests/CMakeLists.txt, fxa_release_kernels_test).
# Not in sanitized builds, which do not run those tests.
if(FXA_BUILD_TESTS AND NOT FXA_SANITIZE)
  get_property(fxa_kernel_srcs GLOBAL PROPERTY FXA_KERNEL_SOURCES)
  add_library(fxattn_kernels_release OBJECT ${fxa_kernel_srcs})
  separate_arguments(fxa_release_flags UNIX_COMMAND "${CMAKE_C_FLAGS_RELEASE}")
  target_compile_options(fxattn_kernels_release PRIVATE
    $<TARGET_PROPERTY:fxattn_obj,COMPILE_OPTIONS> ${fxa_release_flags})
  target_compile_definitions(fxattn_kernels_release PRIVATE
    $<TARGET_PROPERTY:fxattn_obj,COMPILE_DEFINITIONS>)
  target_include_directories(fxattn_kernels_release PRIVATE
    $<TARGET_PROPERTY:fxattn_obj,INCLUDE_DIRECTORIES>)
endif()
