"""Compact rows: `value_dtype` bfloat16 / float16 with stochastic rounding, on both paths.

The NumPy reference (`tests/table/table_reference.py`: `stochastic_round`,
`ReferenceTable(value_dtype=...)`) defines the rounding; the tables of both
backends must match it bit for bit, and checkpoints must move rows between
tables of different value dtypes.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.table import _registry as _table_registry
from npu_rec.table._rounding import stochastic_round
from tests.table.table_reference import ReferenceTable, RefOptimizer, nearest
from tests.table.table_reference import stochastic_round as np_stochastic_round

DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16}
COMPACT_OPTIMIZERS = {
    "sgd": (lambda: npu_rec.optimizers.SGD(0.1), lambda: RefOptimizer("sgd", learning_rate=0.1)),
    "adagrad": (
        lambda: npu_rec.optimizers.Adagrad(0.1),
        lambda: RefOptimizer(
            "adagrad", learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7
        ),
    ),
    "rowwise_adagrad": (
        lambda: npu_rec.optimizers.RowWiseAdagrad(0.1),
        lambda: RefOptimizer(
            "rowwise_adagrad", learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7
        ),
    ),
}

# float32 magnitudes from float16's normal range (and zeros), both signs.
_magnitudes = st.one_of(
    st.just(0.0),
    st.floats(2.0**-14, 60000.0, allow_nan=False, width=32),
)
_values = st.lists(
    st.tuples(_magnitudes, st.booleans()).map(lambda p: -p[0] if p[1] else p[0]),
    min_size=1,
    max_size=24,
)


def _as_float32(values) -> np.ndarray:
    return np.asarray(values).astype(np.float32)


def _bits(values) -> np.ndarray:
    return _as_float32(values).view(np.uint32)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    values=_values,
    key=st.integers(-(2**63), 2**63 - 1),
    step=st.integers(1, 2**40),
    seed=st.integers(0, 2**32 - 1),
)
def test_rounding_matches_the_numpy_definition_bit_for_bit(dtype, values, key, step, seed):
    x = np.array(values, np.float32).reshape(-1, 1).repeat(3, axis=1)  # 3 columns
    keys = np.array([key] * x.shape[0], np.int64)
    got = stochastic_round(
        tf.constant(x), tf.constant(keys), tf.constant(step, tf.int64), seed, DTYPES[dtype]
    )
    assert got.dtype == DTYPES[dtype]
    want = np_stochastic_round(x, keys, step, seed, dtype)
    np.testing.assert_array_equal(_bits(got.numpy()), _bits(want))
    # Each result is one of the two neighbours of x in the storage dtype.
    low, high = np.minimum(want, x), np.maximum(want, x)
    assert np.all(nearest(low, dtype) <= high)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_rounding_is_unbiased_and_round_to_nearest_is_not(dtype, rng):
    """The mean of many roundings of x (other steps) is x; rounding to nearest misses by ~ulp/4."""
    x = rng.uniform(0.25, 0.5, size=(1, 64)).astype(np.float32)
    n = 4000
    xs = np.repeat(x, n, axis=0)
    keys = np.arange(n, dtype=np.int64)  # one row per key: independent bits
    got = stochastic_round(
        tf.constant(xs), tf.constant(keys), tf.constant(7, tf.int64), 11, DTYPES[dtype]
    )
    mean = _as_float32(got.numpy()).astype(np.float64).mean(axis=0)
    ulp = 2.0**-8 if dtype == "bfloat16" else 2.0**-11  # in [0.25, 0.5)
    err = np.abs(mean - x[0])
    assert err.max() < 6 * ulp / np.sqrt(12 * n)
    nearest_err = np.abs(nearest(x, dtype)[0].astype(np.float64) - x[0])
    assert err.mean() < nearest_err.mean() / 5


def _train(table, ref, batches, grads):
    for ids, g in zip(batches, grads, strict=True):
        ids_t = tf.constant(ids, tf.int64)
        emb = npu_rec.sparse_lookup(table, ids_t, timestamps=1)
        assert emb.dtype == tf.float32
        want = ref.lookup(ids, [1] * len(ids))
        np.testing.assert_array_equal(emb.numpy(), want)
        table.apply_gradients(ids_t, tf.constant(g))
        ref.apply(ids, g)


def _assert_bitwise_state(table, ref):
    got, want = table.export(), ref.export()
    np.testing.assert_array_equal(got["keys"], want["keys"])
    np.testing.assert_array_equal(_bits(got["values"]), _bits(want["values"]))
    for name, value in want["slots"].items():
        np.testing.assert_array_equal(_bits(got["slots"][name]), _bits(value))


@pytest.mark.parametrize("kernels", [False, True], ids=["stock", "kernels"])
@pytest.mark.parametrize("opt_name", sorted(COMPACT_OPTIMIZERS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(
        st.lists(st.integers(-3, 20), min_size=1, max_size=12), min_size=1, max_size=4
    ),
    seed=st.integers(0, 2**16),
    num_shards=st.sampled_from([1, 2]),
)
def test_compact_tables_match_the_numpy_reference_bit_for_bit(
    kernels, opt_name, dtype, batches, seed, num_shards
):
    """Lookups read the stored rows as float32; each step rounds as the reference does."""
    rng = np.random.default_rng(seed)
    grads = [rng.normal(size=(len(b), 4)).astype(np.float32) for b in batches]
    make_opt, make_ref = COMPACT_OPTIMIZERS[opt_name]
    _table_registry.clear()
    with _build.forced(kernels):
        table = npu_rec.create_table(
            "compact",
            4,
            optimizer=make_opt(),
            value_dtype=dtype,
            access_threshold=0,
            num_shards=num_shards,
        )
    assert table.backend.name == ("kernels" if kernels and _build.library() else "stock")
    ref = ReferenceTable("compact", 4, make_ref(), value_dtype=dtype)
    _train(table, ref, batches, grads)
    _assert_bitwise_state(table, ref)
    assert table.export()["values"].dtype == np.dtype(DTYPES[dtype].as_numpy_dtype)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_both_paths_store_the_same_bits(dtype, rng):
    """Duplicate ids, admission after counting, a few steps: the kernel and stock tables agree."""
    batches = [rng.integers(0, 30, 40) for _ in range(5)]
    grads = [rng.normal(size=(40, 8)).astype(np.float32) for _ in range(5)]
    states = {}
    for kernels in (False, True):
        _table_registry.clear()
        with _build.forced(kernels):
            table = npu_rec.create_table(
                "paths",
                8,
                optimizer=npu_rec.optimizers.Adagrad(0.05),
                value_dtype=dtype,
                access_threshold=2,
            )
        for ids, g in zip(batches, grads, strict=True):
            npu_rec.sparse_lookup(table, tf.constant(ids), timestamps=1)
            table.apply_gradients(tf.constant(ids), tf.constant(g))
        states[kernels] = table.export()
    np.testing.assert_array_equal(_bits(states[True]["values"]), _bits(states[False]["values"]))
    np.testing.assert_array_equal(states[True]["keys"], states[False]["keys"])


def test_small_updates_accumulate_in_bfloat16_rows():
    """Steps far below bfloat16's resolution still move the rows on average."""
    table = npu_rec.create_table(
        "tiny",
        16,
        optimizer=npu_rec.optimizers.SGD(1.0),
        value_dtype=tf.bfloat16,
        initializer="ones",
    )
    ids = tf.range(64, dtype=tf.int64)
    for _ in range(100):
        npu_rec.sparse_lookup(table, ids)
        table.apply_gradients(ids, tf.fill([64, 16], 1e-4))  # 1/78 of an ulp at 1.0
    mean = _as_float32(table.export()["values"]).mean()
    assert abs(mean - (1.0 - 100 * 1e-4)) < 1e-3  # rounding to nearest would stay at 1.0


def test_rounding_depends_on_table_key_and_step_only():
    """Two tables of the same name see the same rows after the same steps, eagerly or not."""

    def run(eager):
        _table_registry.clear()
        table = npu_rec.create_table(
            "same", 4, optimizer=npu_rec.optimizers.SGD(0.3), value_dtype="float16"
        )
        ids = tf.constant([5, 9, 5, 2], tf.int64)
        grads = tf.constant(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4))

        def step():
            npu_rec.sparse_lookup(table, ids)
            table.apply_gradients(ids, grads)

        fn = step if eager else tf.function(step)
        for _ in range(3):
            fn()
        return table.export()["values"]

    np.testing.assert_array_equal(_bits(run(True)), _bits(run(False)))


@pytest.mark.parametrize(
    "value", ["int8", tf.int32, tf.float64, "half", None, True], ids=lambda v: repr(v)
)
def test_value_dtype_is_validated(value):
    with pytest.raises(ValueError, match=r"`value_dtype` must be tf.float32, tf.bfloat16") as err:
        npu_rec.create_table("bad", 4, value_dtype=value)
    assert f"Received: value_dtype={value!r}" in str(err.value)


@pytest.mark.parametrize("value", ["float32", "bfloat16", "float16", tf.bfloat16, np.float16])
def test_value_dtype_accepts_dtypes_and_names(value):
    table = npu_rec.create_table("ok", 4, value_dtype=value)
    assert table.config.value_dtype == tf.as_dtype(value)
    assert table.state.rows.values.dtype == tf.as_dtype(value)


# ------------------------------------------------------------------ checkpoints
def _make(name, dtype, num_shards=1, optimizer=None):
    return npu_rec.create_table(
        name,
        4,
        optimizer=optimizer or npu_rec.optimizers.RowWiseAdagrad(0.1),
        value_dtype=dtype,
        access_threshold=0,
        num_shards=num_shards,
    )


def _fill(table, rng, steps=3):
    for _ in range(steps):
        ids = tf.constant(rng.integers(0, 50, 30), tf.int64)
        emb = npu_rec.sparse_lookup(table, ids, timestamps=3)
        table.apply_gradients(ids, emb * 0.5 + 0.01)


@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
def test_checkpoints_restore_across_value_dtypes(src, num_shards, tmp_path, rng, caplog):
    """Rows are saved in the storage dtype and restored into any value_dtype, to nearest."""
    _table_registry.clear()
    table = _make("ck", src, num_shards)
    _fill(table, rng)
    saved = table.export()
    manager = TableCheckpointManager(str(tmp_path), [table])
    manager.save(1)
    _fill(table, rng, 1)
    manager.save(2, delta=True)
    saved_delta = table.export()
    for dst in ("float32", "bfloat16", "float16"):
        _table_registry.clear()
        other = _make("ck", dst, num_shards)
        with caplog.at_level(logging.INFO, logger="absl"):
            TableCheckpointManager(str(tmp_path), [other]).restore()
        got = other.export()
        assert got["values"].dtype == np.dtype(tf.as_dtype(dst).as_numpy_dtype)
        np.testing.assert_array_equal(got["keys"], saved_delta["keys"])
        want = nearest(_as_float32(saved_delta["values"]), dst)
        np.testing.assert_array_equal(_bits(got["values"]), _bits(want))
        np.testing.assert_array_equal(
            got["slots"]["accumulator"], saved_delta["slots"]["accumulator"]
        )
        converted = [r for r in caplog.records if "restores" in r.getMessage()]
        assert len(converted) == (0 if dst == src else 1)
        caplog.clear()
    # A full file restores through SparseTable.restore too, and training goes on.
    path = str(tmp_path / "full")
    _table_registry.clear()
    table = _make("ck", src, num_shards)
    _fill(table, rng)
    saved = table.export()
    table.save(path)
    _table_registry.clear()
    back = _make("ck", src, num_shards)
    back.restore(path)
    np.testing.assert_array_equal(_bits(back.export()["values"]), _bits(saved["values"]))
    _fill(back, rng, 1)


def test_a_float32_checkpoint_of_an_older_layout_restores_into_bfloat16(tmp_path, rng):
    """A file without `value_dtype` in its description (float32 rows) still restores."""
    from npu_rec.checkpoint import _file_format

    _table_registry.clear()
    table = _make("old", "float32", optimizer=npu_rec.optimizers.Adagrad(0.1))
    _fill(table, rng)
    st = table.read_state()
    desc = {k: v for k, v in table.describe().items() if k != "value_dtype"}
    path = str(tmp_path / "old")
    _file_format.write_file(
        path, _file_format.table_arrays("old", st), {"tables": {"old": desc}, "kind": "full"}
    )
    _table_registry.clear()
    compact = _make("old", "bfloat16", optimizer=npu_rec.optimizers.Adagrad(0.1))
    compact.restore(path)
    want = nearest(st["values"], "bfloat16")
    np.testing.assert_array_equal(_bits(compact.export()["values"]), _bits(want))


# ------------------------------------------------------------------ memory report
@pytest.mark.parametrize("num_shards", [1, 2])
def test_memory_stats_report_the_compact_bytes(num_shards):
    tables = {}
    for dtype, opt in (
        ("float32", npu_rec.optimizers.Adagrad(0.1)),
        ("bfloat16", npu_rec.optimizers.RowWiseAdagrad(0.1)),
    ):
        tables[dtype] = npu_rec.create_table(
            f"mem_{dtype}",
            16,
            optimizer=opt,
            value_dtype=dtype,
            capacity=1024,
            num_shards=num_shards,
        )
        npu_rec.sparse_lookup(tables[dtype], tf.range(300, dtype=tf.int64))
    full, compact = (tables[d].memory_stats() for d in ("float32", "bfloat16"))
    for stats in (full, compact):
        assert stats["live_keys"] == 300
        parts = stats["rows"] + stats["slots"] + stats["metadata"] + stats["index"]
        assert stats["fallback"] == 0
        assert (stats["memory_rows"], stats["disk_rows"]) == (300, 0)
        assert stats["total_bytes"] == parts
        assert stats["bytes_per_live_key"] == pytest.approx(parts / 300)
    capacity = 1024 if num_shards == 1 else 2 * 512
    assert full["rows"] == capacity * 16 * 4 and compact["rows"] == capacity * 16 * 2
    assert full["slots"] == capacity * 16 * 4 and compact["slots"] == capacity * 4
    assert compact["metadata"] == full["metadata"] and compact["index"] == full["index"]


def test_memory_stats_of_an_empty_table_and_in_a_graph():
    graph = tf.Graph()
    with graph.as_default():
        table = npu_rec.create_table("g", 8, value_dtype="float16", capacity=100)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            stats = table.memory_stats(session=sess)
    assert stats["live_keys"] == 0 and stats["bytes_per_live_key"] == 0.0
    assert stats["rows"] == 100 * 8 * 2
