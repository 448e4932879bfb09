#!/usr/bin/env python3
"""Check the source tree's layering (docs/architecture.md, "Layers").

C (src/, tools/): every `#include "..."` is resolved to a file. Each file
belongs to a folder of src/ (a layer) or to tools/.
  - The folders form a stack with no cycle; the order is LAYERS below, and a
    file may include only headers of its own folder or of folders listed
    below it.
  - A library includes another library's headers only from src/base/ (the
    helpers every library shares: struct_size, spans, conversions, CPU
    features, aligned allocation) and the core's declared internal API
    (CORE_API); its other headers are private to it.
  - tools/ includes only the public headers (include/) and its own.
  - Modules (a .c with the .h of the same name) include each other in no
    cycle; no C file calls a function of a file that calls it back (through
    any chain), nor one defined in a higher layer.
Python (python/src/fxattn): every module belongs to a layer (PY_LAYERS: a
subpackage or a top-level module) and imports, at top level or inside
functions, only modules of its own layer or below, in no cycle; no package
binds a submodule's name to something else (a function named like its
module).

Exits non-zero with one line per violation.
"""

import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# From the ground up; a folder may include only itself and folders before it.
LAYERS = ["base", "kernels", "core", "attn", "grid", "io", "proj", "mpi", "wan"]
# The libraries the folders build (src/*/CMakeLists.txt, src/CMakeLists.txt).
LIBRARY = {
    "base": "fxattn",
    "kernels": "fxattn",
    "core": "fxattn",
    "attn": "fxattn",
    "grid": "fxattn",
    "io": "fxattn_io",
    "proj": "fxattn_proj",
    "mpi": "fxattn_mpi",
    "wan": "fxattn_wan",
}
# The core's declared internal API (FXA_INTERNAL functions other libraries
# call): the context's calls, the thread pool, and blockwise attention
# across ranks.
CORE_API = {"src/core/ctx_api.h", "src/core/pool.h", "src/attn/acc_api.h"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# A function definition at file scope: its name, then its body's brace on a
# line of its own (the tree's clang-format style).
DEF_RE = re.compile(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(\w+)\(([^;{}]*?)\)\s*\n\{", re.M)
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def c_files(top):
    for d, _, names in os.walk(os.path.join(ROOT, top)):
        for n in names:
            if n.endswith((".c", ".h")):
                yield os.path.join(d, n)


def resolve(inc, src):
    for base in (os.path.dirname(src), os.path.join(ROOT, "src"), os.path.join(ROOT, "include"), os.path.join(ROOT, "tools", "common")):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(p):
            return p
    return None


def folder_of(path):
    rel = os.path.relpath(path, ROOT).split(os.sep)
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    return rel[0]  # include, tools, src (files at src/ itself)


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(n):
        index[n] = low[n] = len(index)
        stack.append(n)
        on.add(n)
        for m in sorted(graph.get(n, ())):
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in on:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            comp = []
            while True:
                m = stack.pop()
                on.discard(m)
                comp.append(m)
                if m == n:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return out


def check_c(errors):
    modules = {}
    for top in ("src", "tools"):
        for f in c_files(top):
            rel = os.path.relpath(f, ROOT)
            mod = os.path.splitext(rel)[0]
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            for inc in INCLUDE_RE.findall(text):
                p = resolve(inc, f)
                if p is None:
                    continue  # a system or generated header
                prel = os.path.relpath(p, ROOT)
                src_dir, dst_dir = folder_of(f), folder_of(p)
                if dst_dir != "include" and os.path.splitext(prel)[0] != mod:
                    modules.setdefault(mod, set()).add(os.path.splitext(prel)[0])
                if src_dir == "tools":
                    if dst_dir not in ("tools", "include"):
                        errors.append(f"{rel}: includes {prel}: tools/ uses public headers only")
                    continue
                if dst_dir in ("include", src_dir):
                    continue
                if src_dir not in LAYERS or dst_dir not in LAYERS:
                    errors.append(f"{rel}: includes {prel}: folder not in the layer list")
                    continue
                if LAYERS.index(dst_dir) > LAYERS.index(src_dir):
                    errors.append(f"{rel}: includes {prel}: {src_dir}/ sits below {dst_dir}/")
                if LIBRARY[dst_dir] != LIBRARY[src_dir] and dst_dir != "base" and prel not in CORE_API:
                    errors.append(f"{rel}: includes {prel}: a private header of lib{LIBRARY[dst_dir]}")
    errors.extend("include cycle among: " + ", ".join(c) for c in cycles(modules))
    calls = call_graph()
    errors.extend("call cycle among: " + ", ".join(c) for c in cycles(calls))
    for src, dsts in sorted(calls.items()):
        for dst in sorted(dsts):
            a, b = folder_of(os.path.join(ROOT, src)), folder_of(os.path.join(ROOT, dst))
            if a in LAYERS and b in LAYERS and LAYERS.index(b) > LAYERS.index(a):
                errors.append(f"{src}: calls into {dst}: {a}/ sits below {b}/")


def call_graph():
    """Each .c file -> the .c files that define the non-static functions it calls."""
    texts, defined_in = {}, {}
    for top in ("src", "tools"):
        for f in c_files(top):
            if f.endswith(".c"):
                with open(f, encoding="utf-8") as fh:
                    texts[f] = fh.read()
                for name, _ in DEF_RE.findall(texts[f]):
                    defined_in.setdefault(name, set()).add(f)
    graph = {}
    for f, text in texts.items():
        rel = os.path.relpath(f, ROOT)
        for name in set(CALL_RE.findall(text)):
            where = defined_in.get(name, set())
            if len(where) == 1 and f not in where:
                graph.setdefault(rel, set()).add(os.path.relpath(next(iter(where)), ROOT))
    return graph


# The Python package's layers, from the ground up: a module may import only
# modules of its own layer or of layers before it. A layer is a subpackage
# (every module under it) or a top-level module.
PY_LAYERS = ["_capi", "_common", "plot", "_cli", "attn", "wan", "mpi", "integrations", "diffusers", "__init__"]


def py_modules(pkg_dir):
    """Every module of the package by dotted name below it ("attn.run",
    "mpi" for mpi/__init__.py, "__init__" for the package's own), with its
    file and whether it is a package's __init__."""
    found = {}
    for folder, dirs, files in os.walk(pkg_dir):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
        rel = os.path.relpath(folder, pkg_dir)
        parts = [] if rel == "." else rel.split(os.sep)
        for f in files:
            if not f.endswith(".py"):
                continue
            if f == "__init__.py":
                name = ".".join(parts) or "__init__"
            else:
                name = ".".join(parts + [f[:-3]])
            found[name] = (os.path.join(folder, f), f == "__init__.py")
    return found


def py_resolve(name, is_init, node, modules):
    """The package modules an import statement of module `name` names."""
    here = [] if name == "__init__" else name.split(".")
    base = here if is_init else here[:-1]
    if isinstance(node, ast.Import):
        targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "fxattn"]
        return {".".join(t) or "__init__" for t in targets if ".".join(t) in modules or not t}
    if node.level == 0:
        if not node.module or node.module.split(".")[0] != "fxattn":
            return set()
        prefix = node.module.split(".")[1:]
    else:
        prefix = base[: len(base) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    out = set()
    mod = ".".join(prefix) or "__init__"
    for a in node.names:
        sub = ".".join(prefix + [a.name])
        if sub in modules:  # from package import module
            out.add(sub)
        elif mod in modules:  # from module import name
            out.add(mod)
    return out


def py_layer(name):
    return PY_LAYERS.index(name.split(".")[0])


def check_python(errors):
    pkg_dir = os.path.join(ROOT, "python", "src", "fxattn")
    modules = py_modules(pkg_dir)
    graph = {}
    for name, (path, is_init) in modules.items():
        if name.split(".")[0] not in PY_LAYERS:
            errors.append(f"{os.path.relpath(path, ROOT)}: in no layer of PY_LAYERS")
            continue
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= py_resolve(name, is_init, node, modules)
        deps.discard(name)
        for dep in sorted(deps):
            if dep.split(".")[0] in PY_LAYERS and py_layer(dep) > py_layer(name):
                errors.append(f"{os.path.relpath(path, ROOT)}: imports fxattn.{dep}, a higher layer")
        # A package's __init__ is imported with any of its modules: an import
        # of it from inside the package is no edge of the cycle graph.
        graph[name] = {d for d in deps if not (modules[d][1] and name.startswith(d + "."))}
    errors.extend("python import cycle among: " + ", ".join(c) for c in cycles(graph))
    # No package binds a submodule's name to something else (a function
    # named like its module shadows it: fxattn.attention is a function, so
    # the operator's subpackage is attn/).
    for name, (path, is_init) in modules.items():
        if not is_init:
            continue
        pkg = "" if name == "__init__" else name + "."
        subs = {m[len(pkg) :] for m in modules if m.startswith(pkg) and "." not in m[len(pkg) :] and m != name}
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in tree.body:
            bound = []
            if isinstance(node, ast.ImportFrom):
                bound = [(a.asname or a.name, a.name, node.module or "") for a in node.names]
                bound = [(b, n) for b, n, m in bound if not (m == "" and node.level == 1 and n == b)]
                bound = [b for b, n in bound]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound = [node.name]
            elif isinstance(node, ast.Assign):
                bound = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for b in bound:
                if b in subs:
                    errors.append(f"{os.path.relpath(path, ROOT)}: binds {b!r}, the name of its module {pkg}{b}")


def main():
    errors = []
    check_c(errors)
    check_python(errors)
    for e in errors:
        print(e)
    print(f"layering: {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
