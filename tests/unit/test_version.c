/*
 * test_version: the generated version header (include/fxattn_version.h.in,
 * configured by CMake from project(VERSION)) and fxa_version() agree with
 * each other and with the CMake project version, which tests/CMakeLists.txt
 * passes in as FXA_TEST_PROJECT_VERSION.
 */
#include <stdio.h>
#include <string.h>

#include "fxattn.h"
#include "testutil.h"

#ifndef FXA_TEST_PROJECT_VERSION
#error "tests/CMakeLists.txt defines FXA_TEST_PROJECT_VERSION (the CMake project version)"
#endif

int main(void)
{
    char parts[64];
    snprintf(parts, sizeof parts, "%d.%d.%d", FXA_VERSION_MAJOR, FXA_VERSION_MINOR,
             FXA_VERSION_PATCH);
    CHECK(fxa_version() != NULL, "fxa_version() is NULL");
    CHECK(strcmp(fxa_version(), FXA_VERSION_STRING) == 0, "fxa_version() \"%s\" != header \"%s\"",
          fxa_version(), FXA_VERSION_STRING);
    CHECK(strcmp(FXA_VERSION_STRING, FXA_TEST_PROJECT_VERSION) == 0,
          "FXA_VERSION_STRING \"%s\" != CMake project version \"%s\"", FXA_VERSION_STRING,
          FXA_TEST_PROJECT_VERSION);
    CHECK(strcmp(parts, FXA_VERSION_STRING) == 0, "MAJOR.MINOR.PATCH \"%s\" != \"%s\"", parts,
          FXA_VERSION_STRING);
    CHECK(fxa_version() == fxa_version(), "fxa_version() is not one static string");
    return test_summary("test_version");
}
