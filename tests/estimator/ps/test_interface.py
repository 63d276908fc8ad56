"""The Estimator reaches the parameter-server route through `npu_rec.estimator._ps` only.

Checked over the source (`ast`, nothing imported, the import graph of
`tests/test_layout.py`): no module outside `npu_rec/estimator/_ps/` imports one
of its modules, and only the route (and `create_table`) knows the table side
`npu_rec.distribute._ps`.
"""

from __future__ import annotations

from npu_rec.estimator import _ps
from tests.test_layout import import_graph

ROUTE = "npu_rec.estimator._ps"


def _inside(module: str) -> bool:
    return module == ROUTE or module.startswith(ROUTE + ".")


def test_only_the_route_imports_its_modules():
    graph = import_graph()
    assert {f"{ROUTE}._tasks", f"{ROUTE}._servers", f"{ROUTE}._pause"} <= set(graph)
    bad = [
        f"{a} -> {b}"
        for a, deps in graph.items()
        if not _inside(a)
        for b in deps
        if b.startswith(ROUTE + ".")
    ]
    assert bad == []


def test_the_estimator_uses_the_route_and_the_table_core_its_table_side():
    graph = import_graph()
    users = sorted(a for a, deps in graph.items() if ROUTE in deps and not _inside(a))
    assert users == [
        "npu_rec.estimator._estimator",
        "npu_rec.estimator._run_config",
        "npu_rec.estimator._train_and_evaluate",
        "npu_rec.estimator._training_run",
    ]
    table_side = sorted(a for a, deps in graph.items() if "npu_rec.distribute._ps" in deps)
    assert table_side == [f"{ROUTE}._servers", f"{ROUTE}._tasks", "npu_rec.table._create"]


def test_the_interface_names_what_the_estimator_uses():
    assert set(_ps.__all__) == {
        "CHIEF",
        "EVALUATOR",
        "PS",
        "WORKER",
        "ClusterInfo",
        "Trainer",
        "check_trainable",
        "evaluate_checkpoints",
        "serve",
        "trainer_for",
    }
    for name in ("placement", "position_hook", "session", "paused", "done", "is_chief"):
        assert hasattr(_ps.Trainer, name), name
