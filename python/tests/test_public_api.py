"""The public API, stated in one place: python/public_api.txt lists every
public name of fxattn, fxattn.mpi, fxattn.wan and fxattn.diffusers (with
its parameters; a class with its public methods and properties) and the
schemas of the operators under torch.ops.fxattn. The package as installed
must list exactly that: a name, a parameter or an operator that disappears
or changes fails here, and so does a new public name that the file does not
state. `python python/tests/test_public_api.py` prints the listing."""

import inspect
import sys
from pathlib import Path

import torch

import fxattn
import fxattn.diffusers
import fxattn.mpi
import fxattn.wan
from fxattn.attn import torch_op  # noqa: F401  (registers the operators when fxattn came before torch)

STATED = Path(__file__).resolve().parents[1] / "public_api.txt"
# The modules whose public names are the API: their __all__, and the names
# fxattn.diffusers loads on first use (they import mpi4py).
MODULES = {
    "fxattn": (fxattn, ()),
    "fxattn.mpi": (fxattn.mpi, ()),
    "fxattn.wan": (fxattn.wan, ()),
    "fxattn.diffusers": (fxattn.diffusers, ("parallelize", "Parallelized", "ShardedWanAttnProcessor")),
}
OPERATORS = ("attention", "attention_backward")


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _class_lines(path: str, cls) -> list:
    bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
    lines = [f"class {path}({bases}){_signature(cls)}"]
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(member, property):
            lines.append(f"  property {path}.{name}")
        elif isinstance(member, (staticmethod, classmethod)):
            lines.append(f"  {type(member).__name__} {path}.{name}{_signature(member.__func__)}")
        elif inspect.isfunction(member):
            lines.append(f"  method {path}.{name}{_signature(member)}")
    return lines


def listing() -> list:
    """Every public name and operator schema, one line each (a class's
    members indented under it)."""
    lines = []
    for mod_name, (module, lazy) in MODULES.items():
        for name in sorted(set(module.__all__) | set(lazy)):
            obj = getattr(module, name)
            path = f"{mod_name}.{name}"
            if inspect.isclass(obj):
                lines += _class_lines(path, obj)
            elif callable(obj):
                lines.append(f"def {path}{_signature(obj)}")
            else:
                lines.append(f"value {path}: {type(obj).__name__}")
    for op in OPERATORS:
        lines.append(f"operator {getattr(torch.ops.fxattn, op).default._schema}")
    return lines


def test_the_package_has_the_stated_api():
    stated = [line for line in STATED.read_text().splitlines() if line and not line.startswith("#")]
    now = listing()
    missing = [line for line in stated if line not in now]
    unstated = [line for line in now if line not in stated]
    assert not missing, "public API gone or changed (python/public_api.txt):\n" + "\n".join(missing)
    assert not unstated, "public names python/public_api.txt does not state:\n" + "\n".join(unstated)


def test_the_check_sees_a_missing_name(monkeypatch):
    """The listing follows the package: a public name taken away is gone from it."""
    before = listing()
    monkeypatch.setattr(fxattn, "__all__", [n for n in fxattn.__all__ if n != "check"])
    after = listing()
    assert any(line.startswith("def fxattn.check(") for line in before)
    assert not any(line.startswith("def fxattn.check(") for line in after)


if __name__ == "__main__":
    sys.stdout.write("\n".join(listing()) + "\n")
