"""The Estimator's modules reach the model through `EstimatorCore`, not `NPUEstimator`'s privates.

Checked over the source (`ast`, nothing imported): no module but
`_estimator.py` reads or calls a private member of `NPUEstimator` (its
`_methods` and the `self._attributes` it sets) on another object, and
`_estimator.py` uses nothing of `_training_run` but its `train()`.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ESTIMATOR = ROOT / "npu_rec" / "estimator" / "_estimator.py"


def _private_members() -> set[str]:
    tree = ast.parse(ESTIMATOR.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NPUEstimator"]
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def test_no_module_touches_npu_estimators_private_members():
    private = _private_members()
    assert {"_core", "_trained_checkpoint"} <= private
    found = []
    for path in sorted((ROOT / "npu_rec").rglob("*.py")):
        if path == ESTIMATOR:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert found == []


def test_the_estimator_uses_only_train_from_the_training_module():
    tree = ast.parse(ESTIMATOR.read_text())
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "_training_run"
    }
    assert used == {"train"}
    assert not any(
        isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_training_run")
        for node in ast.walk(tree)
    )
