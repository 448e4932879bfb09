"""The package's layout: imports go one way (no cycle among fxattn's
modules, counting imports inside functions), no module is shadowed by a
package attribute of its name (fxattn.attention is the function; its
module is fxattn._attention), and the version has one source,
project(VERSION) in the top CMakeLists.txt, which pyproject.toml's dynamic
version reads and the C library reports."""

import ast
import importlib
import pkgutil
import re
import types
from pathlib import Path

import fxattn

PKG = Path(fxattn.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[2]


def import_graph() -> dict:
    """module -> the fxattn modules it imports, anywhere in its source."""
    names = {info.name for info in pkgutil.iter_modules([str(PKG)])} | {"__init__"}
    graph = {}
    for name in names:
        tree = ast.parse((PKG / f"{name}.py").read_text())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    deps.add(node.module.split(".")[0])
                elif node.level == 1:
                    deps |= {a.name for a in node.names if a.name in names}
                elif node.level == 0 and node.module and node.module.startswith("fxattn."):
                    deps.add(node.module.split(".")[1])
                elif node.level == 0 and node.module == "fxattn":
                    deps |= {a.name for a in node.names if a.name in names} or {"__init__"}
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "fxattn":
                        deps.add("__init__")
                    elif a.name.startswith("fxattn."):
                        deps.add(a.name.split(".")[1])
        graph[name] = deps & names - {name}
    return graph


def find_cycle(graph: dict):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_imports_form_no_cycle():
    graph = import_graph()
    assert graph["_torch"] and graph["_parallel"], graph  # the graph sees imports at all
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_shadowed():
    for info in pkgutil.iter_modules([str(PKG)]):
        module = importlib.import_module(f"fxattn.{info.name}")
        attr = getattr(fxattn, info.name)
        assert isinstance(attr, types.ModuleType) and attr is module, (
            f"fxattn.{info.name} is {attr!r}, not the module fxattn/{info.name}.py"
        )
    assert callable(fxattn.attention) and callable(fxattn.check)


def cmake_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(fxattn VERSION ([0-9.]+)", text).group(1)


def test_the_version_has_one_source():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M), "pyproject.toml sets a version of its own"
    assert not re.search(r"^version *=", pyproject, re.M), "pyproject.toml sets a version of its own"
    section = pyproject.split("[tool.scikit-build.metadata.version]")[1]
    inp = re.search(r'^input = "(.*)"', section, re.M).group(1)
    regex = re.search(r"^regex = '(.*)'", section, re.M).group(1)
    assert (ROOT / inp).resolve() == (ROOT / "CMakeLists.txt").resolve()
    found = re.search(regex, (ROOT / inp).read_text(), re.M)
    assert found and found.group("value") == cmake_version()
    assert fxattn.__version__ == fxattn.library_version == cmake_version()
    init = (PKG / "__init__.py").read_text()
    assert not re.search(r"^__version__ = ['\"]", init, re.M), "__init__.py writes a version of its own"
