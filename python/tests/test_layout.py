"""The package's layout: no module is shadowed by a package attribute of
its name (fxattn.attention is the function; the operator's subpackage is
fxattn.attn), and the version has one source,
project(VERSION) in the top CMakeLists.txt, which pyproject.toml's dynamic
version reads and the C library reports."""

import importlib
import pkgutil
import re
import types
from pathlib import Path

import fxattn

PKG = Path(fxattn.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[2]


def test_no_module_is_shadowed():
    """Every module of the package, at any depth, is its package's attribute
    of its name (the source tree's check, scripts/check_layering.py, sees
    the same statically)."""
    seen = 0
    for info in pkgutil.walk_packages([str(PKG)], prefix="fxattn.", onerror=lambda name: None):
        parent, _, name = info.name.rpartition(".")
        module = importlib.import_module(info.name)
        attr = getattr(importlib.import_module(parent), name)
        assert isinstance(attr, types.ModuleType) and attr is module, f"{info.name} is shadowed by {attr!r}"
        seen += 1
    assert seen >= 20, seen
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
