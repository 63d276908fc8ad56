"""A table's backend: chosen once at creation, the one place that knows the path."""

import ast
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec._kernels import _build
from npu_rec.table import _registry as _table_registry
from npu_rec.table._backend import TableBackend
from npu_rec.table._fused import KernelBackend
from npu_rec.table._stock import StockBackend

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAVE_KERNELS = shutil.which(os.environ.get("CXX") or "g++") is not None and (
    os.environ.get("NPU_REC_KERNELS") != "off"
)


def _calls(names: set[str]) -> dict[str, list[str]]:
    """`{name: ["path:line", ...]}`: calls of functions or methods named `names`.

    Over the package (outside the kernels' own package), the scripts and the benchmarks.
    """
    found: dict[str, list[str]] = {}
    files = [
        *(ROOT / "npu_rec").rglob("*.py"),
        *(ROOT / "scripts").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
    ]
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("npu_rec/_kernels/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                found.setdefault(name, []).append(f"{rel}:{node.lineno}")
    return found


def test_one_module_asks_whether_the_kernels_are_on():
    """`_kernels._ops.enabled()` (and `_build.library()`) only in the kernel backend's module;
    the choice of a table's backend (`select_backend()`) only in `create_table`'s."""
    calls = _calls({"enabled", "library", "select_backend"})
    assert {c.split(":")[0] for c in calls.get("enabled", [])} == {"npu_rec/table/_fused.py"}
    assert calls.get("library", []) == []
    assert {c.split(":")[0] for c in calls.get("select_backend", [])} == {
        "npu_rec/table/_create.py"
    }, calls["select_backend"]


def test_the_walk_sees_calls(tmp_path):
    # The helper must not pass by finding nothing.
    calls = _calls({"create_table"})
    assert any(c.startswith("npu_rec/") for c in calls["create_table"])


@pytest.mark.parametrize("backend", [StockBackend, KernelBackend])
def test_both_backends_implement_the_whole_interface(backend):
    assert issubclass(backend, TableBackend)
    assert not backend.__abstractmethods__
    assert backend.name in ("stock", "kernels")


@pytest.mark.skipif(not HAVE_KERNELS, reason="no C++ compiler, or NPU_REC_KERNELS=off")
def test_a_table_keeps_the_backend_it_was_created_with():
    """A table made on one path builds its later ops on that path, whatever is on now."""
    _table_registry.clear()
    with _build.forced(False):
        stock = npu_rec.create_table("s", 4, num_shards=2, optimizer=npu_rec.optimizers.SGD(0.1))
    with _build.forced(True):
        kernels = npu_rec.create_table("k", 4, optimizer=npu_rec.optimizers.SGD(0.1))
        assert {s.backend.name for s in stock.shards} == {"stock"}
        assert stock.backend.name == "stock" and not stock.sums_slices

        @tf.function
        def step(table, ids):
            with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
                loss = tf.reduce_sum(npu_rec.sparse_lookup(table, ids))
            grads = tape.gradient(loss, [r.embeddings for r in recs])
            npu_rec.apply_recorded_gradients(recs, grads)
            return loss

        ids = tf.constant([1, 2, 2], tf.int64)
        types = {
            t.name: {op.type for op in step.get_concrete_function(t, ids).graph.get_operations()}
            for t in (stock, kernels)
        }
    assert not any(t.startswith("NpuRec") for t in types["s"])
    assert {"NpuRecTrainLookup", "NpuRecExpand", "NpuRecSparseApply"} <= types["k"]
    assert kernels.backend.name == "kernels" and kernels.sums_slices


def test_memory_stats_count_the_bytes_the_table_holds():
    _table_registry.clear()
    table = npu_rec.create_table(
        "m", 8, optimizer=npu_rec.optimizers.Adam(0.1), capacity=64, dynamic_expansion=True
    )
    npu_rec.sparse_lookup(table, tf.range(100, dtype=tf.int64))
    stats = {k: int(v) for k, v in table.build_memory_stats().items()}
    rows = 128  # 64 doubled once for 100 keys
    assert stats == {
        "live_keys": 100,
        "rows": rows * 8 * 4,
        "slots": 2 * rows * 8 * 4,  # Adam: m and v
        # keys int64; counts, saved counts, last seen int32; no free list until rows are freed
        "metadata": rows * (8 + 3 * 4),
        # 100 keys below 80% load: 128 buckets, 12 B in the kernels' map, 16 B in DenseHashTable
        "index": 128 * table.key_index.bucket_bytes,
    }
    assert table.key_index.bucket_bytes == (12 if table.backend.name == "kernels" else 16)
    assert int(table.size()) == stats["live_keys"]
    assert np.isfinite(list(stats.values())).all()
