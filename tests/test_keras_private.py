"""The private Keras names npu_rec relies on (fenced in `npu_rec._keras_private`) still exist."""

import ast
import pathlib

import keras

from npu_rec import _keras_private

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_private_keras_name_npu_rec_uses_exists():
    gone = _keras_private.missing()
    assert not gone, (
        f"Keras {keras.__version__} no longer has private names npu_rec relies on: {gone}. "
        "Update npu_rec/_keras_private.py (and its REQUIRED list) for this Keras, or install "
        "the Keras version pinned in setup.cfg."
    )
    assert _keras_private.has_global_state()


def test_missing_names_a_vanished_attribute(monkeypatch):
    monkeypatch.setattr(
        _keras_private,
        "REQUIRED",
        (*_keras_private.REQUIRED, ("keras", "Model._no_such_hook"), ("keras.src.nowhere", "X")),
    )
    assert _keras_private.missing() == ["keras:Model._no_such_hook", "keras.src.nowhere:X"]


def test_no_other_module_imports_keras_src():
    offenders = []
    for path in sorted((ROOT / "npu_rec").rglob("*.py")):
        if path.name == "_keras_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for n in names
                if n.startswith("keras.src")
            ]
    assert not offenders, offenders
