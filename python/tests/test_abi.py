"""Every ctypes struct of the package (a class with _c_name_) has the C
struct's size and field offsets, and every enum value and constant the
package mirrors has the C value, as the C compiler sees the installed
headers: a field added, removed or reordered, or a value changed, on either
side fails here."""

import ctypes
import importlib
import os
import pkgutil
import shutil
import subprocess
from pathlib import Path

import fxattn
import fxattn._capi


def mirrored_structs():
    found = {}
    for info in pkgutil.iter_modules(fxattn._capi.__path__):
        mod = importlib.import_module(f"fxattn._capi.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and "_c_name_" in vars(obj):
                found[obj._c_name_] = obj
    return found


def include_dirs():
    pkg = Path(fxattn.__file__).parent
    if (pkg / "include" / "fxattn.h").exists():  # the installed wheel
        return [pkg / "include"]
    lib = Path(os.environ["FXATTN_LIBRARY_PATH"])  # a build tree: lib/ and include/ beside it
    return [Path(__file__).resolve().parents[2] / "include", lib.parent / "include"]


def compile_and_run(tmp_path, body):
    """Build a C program that includes every fxattn header and runs body
    (lines of main); its output as a dict of the first word of each line
    to the rest."""
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    for h in sorted(p.name for d in include_dirs() for p in d.glob("fxattn*.h")):
        lines.append(f'#include "{h}"')
    lines += ["int main(void) {", *body, "return 0;", "}"]
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "abi"
    cc = shutil.which("mpicc") or "cc"  # fxattn_mpi.h includes <mpi.h>
    subprocess.run([cc, "-std=c11", *[f"-I{d}" for d in include_dirs()], str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return dict(line.split(maxsplit=1) for line in out.splitlines())


# The package's mirrors of C enum values and constants: (module, name) -> C.
ENUMS = {
    ("_capi", "OK"): "FXA_OK",
    ("_capi", "INVALID_ARG"): "FXA_ERR_INVALID_ARG",
    ("_capi", "UNSUPPORTED"): "FXA_ERR_UNSUPPORTED",
    ("_capi", "NO_MEMORY"): "FXA_ERR_NO_MEMORY",
    ("_capi", "ERR_MPI"): "FXA_ERR_MPI",
    ("_capi", "INTERNAL"): "FXA_ERR_INTERNAL",
    ("_capi", "ERR_IO"): "FXA_ERR_IO",
    ("_capi", "TIMEOUT"): "FXA_ERR_TIMEOUT",
    ("_capi", "F32"): "FXA_F32",
    ("_capi", "BF16"): "FXA_BF16",
    ("_capi", "F16"): "FXA_F16",
    ("_capi", "F64"): "FXA_F64",
    ("_capi", "LAYOUT_BSHD"): "FXA_LAYOUT_BSHD",
    ("_capi", "LAYOUT_BHSD"): "FXA_LAYOUT_BHSD",
    ("_capi", "MODE_AUTO"): "FXA_MODE_AUTO",
    ("_capi", "MODE_ONLINE"): "FXA_MODE_ONLINE",
    ("_capi", "COMPUTE_FP32"): "FXA_COMPUTE_FP32",
    ("_capi", "COMPUTE_BF16"): "FXA_COMPUTE_BF16",
    ("_capi", "COMPUTE_AUTO"): "FXA_COMPUTE_AUTO",
    ("_capi", "COMPUTE_FP64"): "FXA_COMPUTE_FP64",
    ("_capi", "MASK_NONE"): "FXA_MASK_NONE",
    ("_capi", "MASK_BOOL"): "FXA_MASK_BOOL",
    ("_capi", "MASK_ADD"): "FXA_MASK_ADD",
    ("_capi", "MASK_ADD_F64"): "FXA_MASK_ADD_F64",
    ("_capi", "CAUSAL_UPPER_LEFT"): "FXA_CAUSAL_UPPER_LEFT",
    ("_capi", "CAUSAL_LOWER_RIGHT"): "FXA_CAUSAL_LOWER_RIGHT",
    ("_capi.mpi", "PLACE_HOSTS"): "FXA_MPI_PLACE_HOSTS",
    ("_capi.mpi", "PLACE_RANKS"): "FXA_MPI_PLACE_RANKS",
    ("_capi.grid", "MAX_STEP_RATES"): "FXA_GRID_MAX_STEP_RATES",
    ("_capi.grid", "MEASURE_INTER"): "FXA_GRID_MEASURE_INTER",
    ("_capi.grid", "MEASURE_INTER_CPU"): "FXA_GRID_MEASURE_INTER_CPU",
    ("_capi.grid", "MEASURE_INTRA"): "FXA_GRID_MEASURE_INTRA",
    ("_capi.grid", "MEASURE_INTRA_CPU"): "FXA_GRID_MEASURE_INTRA_CPU",
    ("_capi.grid", "MEASURE_COMPUTE"): "FXA_GRID_MEASURE_COMPUTE",
    ("_capi.grid", "MEASURE_CALL"): "FXA_GRID_MEASURE_CALL",
    ("_capi.grid", "MEASURE_ALL"): "FXA_GRID_MEASURE_ALL",
    ("_capi.grid", "UNEVEN_HOSTS"): "FXA_GRID_UNEVEN_HOSTS",
    ("_capi.wan", "PROJ_X_F32"): "FXA_PROJ_X_F32",
    ("_capi.wan", "PROJ_X_BF16"): "FXA_PROJ_X_BF16",
    ("_capi.wan", "PROJ_X_E4M3_ROWS"): "FXA_PROJ_X_E4M3_ROWS",
    ("_capi.wan", "PROJ_W_F32"): "FXA_PROJ_W_F32",
    ("_capi.wan", "PROJ_W_BF16"): "FXA_PROJ_W_BF16",
    ("_capi.wan", "PROJ_W_E4M3"): "FXA_PROJ_W_E4M3",
    ("_capi.wan", "F32"): "FXA_F32",
    ("_capi.wan", "BF16"): "FXA_BF16",
    ("_capi.wan", "SYNTH_X"): "FXA_WAN_SYNTH_X",
}
FLOATS = {
    ("_capi.wan", "EPS"): "FXA_WAN_EPS",
    ("_capi.wan", "ROPE_THETA"): "FXA_WAN_ROPE_THETA",
}


def test_enum_values_match_the_c_headers(tmp_path):
    body = [f'printf("{c} %lld\\n", (long long){c});' for c in set(ENUMS.values())]
    body += [f'printf("{c} %.17g\\n", (double){c});' for c in FLOATS.values()]
    seen = compile_and_run(tmp_path, body)
    for (mod, name), c in ENUMS.items():
        value = getattr(importlib.import_module(f"fxattn.{mod}"), name)
        assert value == int(seen[c]), f"fxattn.{mod}.{name} is {value}, {c} is {seen[c]}"
    for (mod, name), c in FLOATS.items():
        value = getattr(importlib.import_module(f"fxattn.{mod}"), name)
        assert value == float(seen[c]), f"fxattn.{mod}.{name} is {value}, {c} is {seen[c]}"
    # The mirror holds every status: fxa_status_str knows no value past them.
    from fxattn._capi import core

    statuses = sorted(int(seen[c]) for c in ENUMS.values() if c == "FXA_OK" or c.startswith("FXA_ERR_"))
    assert statuses == list(range(len(statuses)))
    assert all(core.fxa_status_str(s) != b"unknown status" for s in statuses)
    assert core.fxa_status_str(len(statuses)) == b"unknown status"


def test_structs_match_the_c_headers(tmp_path):
    structs = mirrored_structs()
    assert {
        "fxa_attn_desc",
        "fxa_attn_args",
        "fxa_mask_strides",
        "fxa_attn_stats",
        "fxa_ctx_params",
        "fxa_check_head",
        "fxa_check_desc",
        "fxa_wan_desc",
        "fxa_wan_weights",
        "fxa_mpi_params",
        "fxa_mpi_stats",
        "fxa_grid_model",
        "fxa_grid_time",
        "fxa_grid_link",
        "fxa_compute_choice",
        "fxa_wan_args",
    } <= set(structs)
    body = []
    for cname, py in structs.items():
        body.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for field, _ in py._fields_:
            body.append(f'printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    seen = compile_and_run(tmp_path, body)
    for cname, py in structs.items():
        assert int(seen[cname]) == ctypes.sizeof(py), cname
        for field, _ in py._fields_:
            assert int(seen[f"{cname}.{field}"]) == getattr(py, field).offset, f"{cname}.{field}"
