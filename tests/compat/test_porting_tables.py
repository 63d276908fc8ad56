"""docs/porting.md's mx_rec and npu_bridge name tables list exactly the compat packages' names."""

import ast
import importlib
import inspect
import pathlib
import pkgutil
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Importing it turns TensorFlow 2 behaviour off for the whole process: read, not imported.
NOT_IMPORTED = "npu_rec.compat.npu_bridge.npu_init"


def _source_all(module: str) -> list[str]:
    path = ROOT / (module.replace(".", "/") + ".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


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
            prefix = info.name.replace("npu_rec.compat.", "")
            if info.name == NOT_IMPORTED:
                names.update(f"{prefix}.{n}" for n in _source_all(info.name))
                continue
            mod = importlib.import_module(info.name)
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
        if module == NOT_IMPORTED:
            assert attr in _source_all(module), name
        else:
            assert hasattr(importlib.import_module(module), attr), name
