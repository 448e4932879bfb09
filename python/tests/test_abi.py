"""Every ctypes struct of the package (a class with _c_name_) has the C
struct's size and field offsets, as the C compiler sees the installed
headers: a field added, removed or reordered on either side fails here."""

import ctypes
import importlib
import os
import pkgutil
import shutil
import subprocess
from pathlib import Path

import fxattn


def mirrored_structs():
    found = {}
    for info in pkgutil.iter_modules(fxattn.__path__):
        if info.name in ("diffusers", "_parallel", "_wan_qkv"):  # import torch/diffusers; no structs
            continue
        mod = importlib.import_module(f"fxattn.{info.name}")
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


def test_structs_match_the_c_headers(tmp_path):
    structs = mirrored_structs()
    assert {"fxa_attn_desc", "fxa_attn_args", "fxa_attn_stats", "fxa_ctx_params", "fxa_check_head",
            "fxa_wan_desc", "fxa_wan_weights", "fxa_mpi_params", "fxa_mpi_stats", "fxa_grid_model",
            "fxa_grid_time", "fxa_grid_link"} <= set(structs)
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    for h in sorted(p.name for d in include_dirs() for p in d.glob("fxattn*.h")):
        lines.append(f'#include "{h}"')
    lines.append("int main(void) {")
    for cname, py in structs.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for field, _ in py._fields_:
            lines.append(f'printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "abi"
    cc = shutil.which("mpicc") or "cc"  # fxattn_mpi.h includes <mpi.h>
    subprocess.run([cc, "-std=c11", *[f"-I{d}" for d in include_dirs()], str(src), "-o", str(exe)], check=True)
    seen = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines())
    for cname, py in structs.items():
        assert int(seen[cname]) == ctypes.sizeof(py), cname
        for field, _ in py._fields_:
            assert int(seen[f"{cname}.{field}"]) == getattr(py, field).offset, f"{cname}.{field}"
