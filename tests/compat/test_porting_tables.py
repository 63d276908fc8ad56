"""docs/porting.md's mx_rec and npu_bridge name tables list exactly the compat packages' names."""

import importlib
import inspect
import pathlib
import pkgutil
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def exported(mod):
    """`__all__`, else the public classes/functions defined there and upper-case constants."""
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return sorted(
        n
        for n, o in vars(mod).items()
        if not n.startswith("_")
        and (
            ((inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == mod.__name__)
            or (isinstance(o, str) and n.isupper())
        )
    )


def compat_names():
    names = set()
    for pkg in ("mx_rec", "npu_bridge"):
        root = importlib.import_module(f"npu_rec.compat.{pkg}")
        for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
            if info.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            mod = importlib.import_module(info.name)
            prefix = info.name.replace("npu_rec.compat.", "")
            names.update(f"{prefix}.{n}" for n in exported(mod))
    return names


def documented_names():
    text = (ROOT / "docs" / "porting.md").read_text()
    start = text.index("## mx_rec names")
    end = text.index("## Rec SDK examples")
    return set(re.findall(r"^\| `((?:mx_rec|npu_bridge)\.[\w.]+)`", text[start:end], re.M))


def test_tables_list_exactly_the_compat_names():
    names, documented = compat_names(), documented_names()
    assert sorted(names - documented) == [], "exported but not in docs/porting.md"
    assert sorted(documented - names) == [], "in docs/porting.md but not exported"


def test_every_documented_name_exists():
    for name in documented_names():
        module, _, attr = f"npu_rec.compat.{name}".rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name
