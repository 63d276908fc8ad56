"""The compiled table kernels against the stock-op path (the reference), and their build.

The rest of the suite runs on whichever path `tests/conftest.py` loaded (the
kernels when a compiler is present); these tests run both paths in one
process (`kernel_path`) and compare them, and check the build, the cache and
the fallback in subprocesses.
"""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build
from npu_rec._kernels import _ops as kernel_ops
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.table import _registry as _table_registry
from tests.table.table_helpers import OPTIMIZERS, assert_same_states, full_state
from tests.table.table_reference import keyed_uniform
from tests.table.test_table_properties import FEATURES, _op, _run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_CXX = shutil.which(os.environ.get("CXX") or "g++") is not None
needs_kernels = pytest.mark.skipif(
    not HAVE_CXX or os.environ.get("NPU_REC_KERNELS") == "off",
    reason="no C++ compiler, or NPU_REC_KERNELS=off: the kernel path is not built",
)


kernel_path = _build.forced


@needs_kernels
def test_the_suite_runs_on_the_kernel_path_when_a_compiler_is_present():
    assert kernel_ops.enabled()
    assert os.path.exists(_build.library_path())


# --------------------------------------------------------------- equality
@needs_kernels
@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(_op, min_size=4, max_size=7),
    seed=st.integers(0, 2**16),
    num_shards=st.sampled_from([1, 3]),
)
def test_kernel_path_matches_stock_path_and_reference(
    opt_name, feature, ops, seed, num_shards, tmp_path
):
    """Random lookup / step / evict / save / restore sequences: states equal after every op.

    Every optimizer and feature mix (admission, eviction, dynamic expansion on
    and off); hypothesis draws one or three shards. `_run` also checks each
    path against the NumPy reference.
    """
    states = {}
    for on in (False, True):
        states[on] = []
        (tmp_path / f"k{on}").mkdir(exist_ok=True)
        with kernel_path(on):
            _run(opt_name, feature, ops, seed, tmp_path / f"k{on}", num_shards, states[on])
    assert len(states[True]) == len(ops)
    for got, want in zip(states[True], states[False], strict=True):
        assert_same_states(got, want, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("delta", [False, True])
def test_checkpoints_restore_across_paths(delta, tmp_path, rng):
    """A stock-path save restores on the kernel path (and back) and trains on identically."""
    ids = [rng.integers(0, 40, 24) for _ in range(6)]

    def train(table, batches):
        for i, batch in enumerate(batches):
            x = tf.constant(batch, tf.int64)
            emb = npu_rec.sparse_lookup(table, x, timestamps=tf.constant(100 + i, tf.int64))
            table.apply_gradients(x, tf.ones_like(emb) * 0.5)

    def make():
        _table_registry.clear()
        return npu_rec.create_table(
            "x",
            4,
            optimizer=npu_rec.optimizers.Adam(0.01),
            access_threshold=2,
            eviction_threshold=3,
            capacity=8,
            dynamic_expansion=True,
        )

    finals = {}
    for writer in (False, True):
        with kernel_path(writer):
            table = make()
            manager = TableCheckpointManager(str(tmp_path / f"w{writer}"), [table])
            train(table, ids[:2])
            manager.save(1)
            train(table, ids[2:4])
            table.evict(106)
            manager.save(2, delta=delta)
        for reader in (False, True):
            with kernel_path(reader):
                table = make()
                TableCheckpointManager(str(tmp_path / f"w{writer}"), [table]).restore()
                train(table, ids[4:])
                finals[writer, reader] = full_state(table)
    assert len(finals) == 4
    for state in finals.values():
        assert_same_states(state, finals[False, False], atol=1e-6)


@needs_kernels
@pytest.mark.parametrize(
    "access, initializer",
    [(1, None), (1, "constant"), (2, None)],
    ids=["admit_in_kernel", "admit_by_stock_initializer", "admit_after_counting"],
)
def test_fused_lookup_edge_cases_match_the_stock_path(access, initializer, rng):
    """Reserved raw ids, int32 keys, prepared ids, late timestamps, full-table errors.

    Tables that admit at once with the keyed initialiser admit inside the lookup
    kernel; the others admit through the stock ops: both give the stock state.
    """
    from npu_rec.table._key_index import RESERVED_RAW_KEYS

    reserved = np.array(RESERVED_RAW_KEYS, np.int64)
    batches = [np.concatenate([rng.integers(-5, 30, 12), reserved[: i % 3]]) for i in range(6)]
    init = keras.initializers.Constant(0.25) if initializer else None

    def run():
        _table_registry.clear()
        tables = [
            npu_rec.create_table(
                name,
                3,
                optimizer=npu_rec.optimizers.Adagrad(0.1),
                access_threshold=access,
                eviction_threshold=4,
                capacity=3,
                dynamic_expansion=True,
                initializer=init,
                key_dtype=dtype,
            )
            for name, dtype in (("wide", tf.int64), ("narrow", tf.int32))
        ]
        fixed = npu_rec.create_table("fixed", 3, capacity=2, access_threshold=access)
        out = []
        for i, batch in enumerate(batches):
            for table in tables:
                ids = batch if table.key_dtype == tf.int64 else batch[batch < 2**31]
                ids = tf.constant(ids.reshape(-1, 1), tf.int64)
                prepared = npu_rec.prepare_ids(ids) if i % 2 else ids
                stamps = tf.constant(100 + i + np.arange(len(ids)) % 3, tf.int64)[:, None]
                if i == 3:
                    stamps = tf.fill(tf.shape(ids), tf.constant(2**60, tf.int64))
                emb = npu_rec.sparse_lookup(table, prepared, timestamps=stamps)
                table.apply_gradients(ids, tf.ones_like(emb))
                out.append(emb.numpy())
            if i == 4:
                tables[0].evict()
        with pytest.raises(tf.errors.InvalidArgumentError, match="^Sparse table 'fixed' is full"):
            npu_rec.sparse_lookup(fixed, tf.constant([1, 2, 3, 1, 2, 3], tf.int64))
        return out, [full_state(t) for t in (*tables, fixed)]

    results = {}
    for on in (False, True):
        with kernel_path(on):
            results[on] = run()
    (emb_k, states_k), (emb_s, states_s) = results[True], results[False]
    for got, want in zip(emb_k, emb_s, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    for got, want in zip(states_k, states_s, strict=True):
        assert_same_states(got, want, atol=1e-6)
    assert set(RESERVED_RAW_KEYS) <= set(states_k[0]["keys"].tolist())
    assert states_k[1]["keys"].size > 0 and states_k[2]["keys"].size == 0


@needs_kernels
@pytest.mark.parametrize("access", [1, 2], ids=["admit_in_kernel", "admit_after_counting"])
def test_large_batches_match_the_stock_path(access, rng):
    """Batches of >= 65536 ids (deduplicated on several threads) keep the stock order.

    Rows are allocated in the order of the unique keys, so the row of every key,
    its count and last-seen time show whether the kernel kept
    `tf.unique_with_counts`' first-occurrence order.
    """
    batches = [
        (rng.zipf(1.2, 70_000) % 30_000 + rng.integers(0, 2, 70_000) * (1 << 50)).astype(np.int64)
        for _ in range(3)
    ]

    def run():
        _table_registry.clear()
        table = npu_rec.create_table(
            "big", 2, capacity=1 << 16, access_threshold=access, dynamic_expansion=True
        )
        out = []
        for i, ids in enumerate(batches):
            stamps = tf.constant(10 + i + np.arange(ids.size) % 7, tf.int64)[:, None]
            emb = npu_rec.sparse_lookup(table, tf.constant(ids[:, None]), timestamps=stamps)
            out.append(emb.numpy())
        return out, full_state(table)

    results = {}
    for on in (False, True):
        with kernel_path(on):
            results[on] = run()
    for got, want in zip(results[True][0], results[False][0], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert_same_states(results[True][1], results[False][1], atol=1e-6)


@needs_kernels
def test_large_batch_deduplication_gives_unique_with_counts_order(rng):
    """The kernel's unique keys, index, sightings and newest times of a >= 65536-id batch."""
    ids = (rng.zipf(1.2, 90_000) % 40_000 * 7 + rng.integers(0, 2, 90_000) * (1 << 50)).astype(
        np.int64
    )
    times = rng.integers(0, 1000, ids.size).astype(np.int64)
    with kernel_path(True):
        _table_registry.clear()
        table = npu_rec.create_table("dedup", 2, capacity=8, access_threshold=2)
        out = kernel_ops.train_lookup(
            table.key_index,
            table.storage,
            tf.constant(ids),
            None,
            tf.constant(times),
            batch_time=False,
        )
    unique, index, counts = (t.numpy() for t in tf.unique_with_counts(ids, out_idx=tf.int64))
    np.testing.assert_array_equal(out.unique.numpy(), unique)
    np.testing.assert_array_equal(out.index.numpy(), index)
    # Nothing is admitted (threshold 2): every unique key comes back as a miss, in order.
    np.testing.assert_array_equal(out.miss_keys.numpy(), unique)
    np.testing.assert_array_equal(out.miss_counts.numpy(), counts)
    newest = np.full(unique.size, -1, np.int64)
    np.maximum.at(newest, index, times)
    np.testing.assert_array_equal(out.miss_times.numpy(), newest)


@needs_kernels
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    u=st.integers(1, 40),
    n=st.sampled_from([0, 1, 7, 300, 40_000]),  # 40,000 x dim 4+ runs on the intra-op threads
    dim=st.sampled_from([1, 4, 16, 33]),
    seed=st.integers(0, 2**31 - 1),
)
def test_expand_is_tf_gather_with_its_gradient(u, n, dim, seed):
    """`NpuRecExpand` against `tf.gather` and NumPy: values, and the IndexedSlices gradient."""
    rng = np.random.default_rng(seed)
    params = tf.constant(rng.normal(size=(u, dim)).astype(np.float32))
    index = tf.constant(rng.integers(0, u, n), tf.int64)
    weights = tf.constant(rng.normal(size=(n, dim)).astype(np.float32))
    grads = []
    for expand in (kernel_ops.expand, tf.gather):
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = expand(params, index)
            loss = tf.reduce_sum(out * weights)
        np.testing.assert_array_equal(out.numpy(), params.numpy()[index.numpy()])
        grad = tape.gradient(loss, params)
        assert isinstance(grad, tf.IndexedSlices)
        grads.append(grad)
    ours, stock = grads
    np.testing.assert_array_equal(ours.indices.numpy(), stock.indices.numpy())
    np.testing.assert_array_equal(ours.values.numpy(), stock.values.numpy())
    np.testing.assert_array_equal(ours.dense_shape.numpy(), [u, dim])
    summed = np.zeros((u, dim), np.float32)
    np.add.at(summed, index.numpy(), weights.numpy())
    np.testing.assert_allclose(tf.convert_to_tensor(ours).numpy(), summed, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_expand_refuses_an_index_outside_the_rows():
    params = tf.zeros([3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index\[1\] = 3 is not in \[0, 3\)"):
        kernel_ops.expand(params, tf.constant([0, 3], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index\[0\] = -1 is not in"):
        kernel_ops.expand(params, tf.constant([-1], tf.int64))


@needs_kernels
def test_training_lookups_on_the_kernel_path_expand_with_the_kernel():
    """The graph of a kernel-path training step holds NpuRecExpand and no GatherV2 of rows."""
    with kernel_path(True):
        _table_registry.clear()
        table = npu_rec.create_table("expand_graph", 4, optimizer=npu_rec.optimizers.SGD(0.1))

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
                loss = tf.reduce_sum(npu_rec.sparse_lookup(table, ids))
            npu_rec.apply_recorded_gradients(
                recs, tape.gradient(loss, [r.embeddings for r in recs])
            )
            return loss

        graph = step.get_concrete_function(tf.TensorSpec([None, 3], tf.int64)).graph
        step(tf.constant([[1, 2, 1], [3, 3, 3]], tf.int64))
    types = [op.type for op in graph.get_operations()]
    assert types.count("NpuRecExpand") == 1 and "GatherV2" not in types
    # d loss / d row = number of sightings: SGD moved row 3 by 3 * 0.1 per element, row 1 by 2 * 0.1.
    exported = table.export()
    rows = dict(zip(exported["keys"].tolist(), exported["values"], strict=True))
    start = {k: keyed_uniform(k, 4, "expand_graph") for k in (1, 2, 3)}
    np.testing.assert_allclose(rows[3], start[3] - 0.3, atol=1e-6)
    np.testing.assert_allclose(rows[1], start[1] - 0.2, atol=1e-6)
    np.testing.assert_allclose(rows[2], start[2] - 0.1, atol=1e-6)


# --------------------------------------------------------------- modes
def _train_model(mode: str, steps: int = 5):
    """A small model (two tables, a dense layer) trained `steps` steps; returns its weights."""
    _table_registry.clear()
    rng = np.random.default_rng(7)
    batches = [
        (
            rng.integers(0, 60, (16, 3)),
            rng.integers(0, 9, 16),
            rng.normal(size=(16, 1)).astype(np.float32),
        )
        for _ in range(steps)
    ]

    def build():
        tables = [
            npu_rec.create_table(
                "a",
                4,
                optimizer=npu_rec.optimizers.Ftrl(0.1, l1=0.01),
                access_threshold=2,
                capacity=16,
                dynamic_expansion=True,
            ),
            npu_rec.create_table("b", 4, optimizer=npu_rec.optimizers.Adagrad(0.1), capacity=32),
        ]
        w = tf.Variable(np.linspace(-1, 1, 8).reshape(8, 1).astype(np.float32))
        return tables, w

    def step(tables, w, a_ids, b_ids, y):
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
            h = tf.concat(
                [
                    npu_rec.sparse_lookup(tables[0], a_ids, combiner="mean"),
                    npu_rec.sparse_lookup(tables[1], b_ids),
                ],
                1,
            )
            loss = tf.reduce_mean(tf.square(h @ w - y))
        if mode == "v1":
            grads = tf.gradients(loss, [w] + [r.embeddings for r in recs])
        else:
            grads = tape.gradient(loss, [w] + [r.embeddings for r in recs])
        assert all(g is not None for g in grads)
        return tf.group(
            w.assign_sub(0.1 * grads[0]),
            npu_rec.apply_recorded_gradients(recs, grads[1:]) or tf.no_op(),
        )

    if mode == "v1":
        graph = tf.Graph()
        with graph.as_default():
            tables, w = build()
            ph = (
                tf.compat.v1.placeholder(tf.int64, [None, 3]),
                tf.compat.v1.placeholder(tf.int64, [None]),
                tf.compat.v1.placeholder(tf.float32, [None, 1]),
            )
            train = step(tables, w, *ph)
            init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            for batch in batches:
                sess.run(train, dict(zip(ph, batch, strict=True)))
            return ([t.export(session=sess) for t in tables], sess.run(w))
    tables, w = build()

    def run(*args):
        step(tables, w, *args)

    run = tf.function(run) if mode == "function" else run
    for a_ids, b_ids, y in batches:
        run(tf.constant(a_ids), tf.constant(b_ids), tf.constant(y))
    return [t.export() for t in tables], w.numpy()


@needs_kernels
@pytest.mark.parametrize("mode", ["eager", "function", "v1"])
def test_same_model_trains_to_same_weights_on_both_paths(mode):
    results = {}
    for on in (False, True):
        with kernel_path(on):
            results[on] = _train_model(mode)
    (stock_tables, stock_w), (kern_tables, kern_w) = results[False], results[True]
    np.testing.assert_allclose(kern_w, stock_w, atol=1e-5)
    for got, want in zip(kern_tables, stock_tables, strict=True):
        np.testing.assert_array_equal(got["keys"], want["keys"])
        assert got["keys"].size > 0
        np.testing.assert_allclose(got["values"], want["values"], atol=1e-5)
        for slot in want["slots"]:
            np.testing.assert_allclose(got["slots"][slot], want["slots"][slot], atol=1e-5)
        np.testing.assert_array_equal(got["counts"], want["counts"])


# --------------------------------------------------------------- thread safety
@pytest.mark.parametrize("on", [False, True], ids=["stock", "kernels"])
def test_concurrent_lookups_and_eviction_of_one_table_in_one_graph(on, rng):
    """Three lookups and an eviction of one table per run, in parallel inter-op threads.

    Before the table lock this handed one row to two keys within a few steps
    (on both paths); every saved state is checked for that (`_table_check`).
    """
    if on and not HAVE_CXX:
        pytest.skip("no C++ compiler")
    with kernel_path(on):
        graph = tf.Graph()
        with graph.as_default():
            table = npu_rec.create_table(
                "c",
                4,
                optimizer=npu_rec.optimizers.Adagrad(0.1),
                access_threshold=1,
                eviction_threshold=5,
                capacity=32,
                dynamic_expansion=True,
            )
            ids = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in range(3)]
            now = tf.compat.v1.placeholder(tf.int64, [])
            with npu_rec.record_lookups() as recs:
                loss = tf.add_n(
                    [
                        tf.reduce_sum(tf.square(npu_rec.sparse_lookup(table, i, timestamps=now)))
                        for i in ids
                    ]
                )
            grads = tf.gradients(loss, [r.embeddings for r in recs])
            train = npu_rec.apply_recorded_gradients(recs, grads)
            evict = table.evict(now - 3)
            init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(init)
            for step in range(60):
                feed = {p: rng.integers(0, 300, 40) for p in ids}
                feed[now] = step
                sess.run([train, evict], feed)
            state = table.read_state(session=sess)  # raises on a broken invariant
            assert len(np.unique(state["keys"])) == len(state["keys"]) == sess.run(table.size())


_GROWTH_RSS = """
    import gc, os
    import numpy as np, tensorflow as tf
    import npu_rec

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def make(name):
        return npu_rec.create_table(
            name, 64, optimizer=npu_rec.optimizers.Adagrad(0.05), capacity=1024,
            dynamic_expansion=True, access_threshold=1, eviction_threshold=3600)

    @tf.function(reduce_retracing=True)
    def look(table, keys):
        return tf.reduce_sum(npu_rec.sparse_lookup(table, keys)[:1])

    keys = np.arange(1, 400_001, dtype=np.int64) * 7919
    warm = make("warm")  # TensorFlow's one-time start-up memory, before the baseline
    for s in range(0, 60_000, 20_000):
        look(warm, tf.constant(keys[s:s + 20_000] + 1))
    gc.collect()
    before = rss()
    table = make("grown")  # grows by doubling, 1024 -> 524288 rows
    for s in range(0, len(keys), 20_000):
        look(table, tf.constant(keys[s:s + 20_000]))
    gc.collect()
    held = sum(int(np.prod(tf.raw_ops.VariableShape(input=v.handle).numpy())) * v.dtype.size
               for v in table.variables())
    print("RATIO", (rss() - before) / held)
"""


@needs_kernels
def test_a_process_keeps_the_kernel_library_it_loaded_when_the_sources_change(monkeypatch):
    # E.g. a benchmark comparing both paths (`forced` resets the decision) while the
    # package is edited: a second library would load without its ops (TensorFlow
    # registers an op name once) and every later trace would fail.
    with kernel_path(True):
        lib = _build.library()
        monkeypatch.setattr(_build, "library_path", lambda: "/nonexistent/other_sources.so")
    with kernel_path(True):
        assert _build.library() is lib
        assert hasattr(lib, "npu_rec_train_lookup")


@needs_kernels
@pytest.mark.skipif(
    os.environ.get("NPU_REC_KERNEL_SANITIZE", "") not in ("", "0"),
    reason="under AddressSanitizer the RSS holds its shadow memory and freed-block quarantine",
)
def test_a_table_grown_by_the_kernels_holds_about_its_own_size_in_memory():
    # The kernels allocate grown buffers outside TensorFlow's pooled CPU allocator, so
    # the buffers a table outgrows go back to the system: the process grows by about
    # the table's variables (334 MB here; plus the key index and the step's tensors),
    # not by every size it went through (3.1x measured when the pool kept them).
    out = _python(_GROWTH_RSS, {"NPU_REC_KERNELS": "on"})
    assert out.returncode == 0, out.stderr[-3000:]
    ratio = float(out.stdout.split("RATIO")[1])
    assert ratio < 1.5, f"RSS grew by {ratio:.2f}x the table's variables"


_SPARE_RSS = """
    import gc, os
    import numpy as np, tensorflow as tf
    import npu_rec

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def make(name, capacity):
        return npu_rec.create_table(
            name, 16, optimizer=npu_rec.optimizers.Adagrad(0.05), capacity=capacity,
            dynamic_expansion=True, access_threshold=-1)

    @tf.function(reduce_retracing=True)
    def look(table, keys):
        return tf.reduce_sum(npu_rec.sparse_lookup(table, keys)[:1])

    keys = np.arange(1, 50_001, dtype=np.int64) * 7919
    warm = make("warm", 1024)  # TensorFlow's one-time start-up memory, before the baseline
    for s in range(0, 60_000, 20_000):
        look(warm, tf.constant(keys[s:s + 20_000] + 1))
    gc.collect()
    before = rss()
    table = make("spare", 1_000_000)  # 20x the keys it will hold
    for s in range(0, len(keys), 20_000):
        look(table, tf.constant(keys[s:s + 20_000]))
    gc.collect()
    grown = rss() - before
    held = sum(int(np.prod(tf.raw_ops.VariableShape(input=v.handle).numpy())) * v.dtype.size
               for v in table.variables())
    used = int(table.storage.next_row.numpy())
    spare = [v.numpy()[used:] for v in table.storage.per_row_variables()]
    print("RATIO", grown / held, "USED", used, "SPARE_ZERO", all(not x.any() for x in spare))
"""


@needs_kernels
@pytest.mark.skipif(
    os.environ.get("NPU_REC_KERNEL_SANITIZE", "") not in ("", "0"),
    reason="under AddressSanitizer the RSS holds its shadow memory and freed-block quarantine",
)
def test_spare_capacity_takes_no_memory_until_used_and_reads_as_zeros():
    # 1M rows allocated (148 MB of variables), 50k used: the rows past the
    # high-water mark are zero pages the kernels never wrote, not resident
    # (writing the zeros would make the process grow by about `held`).
    out = _python(_SPARE_RSS, {"NPU_REC_KERNELS": "on"})
    assert out.returncode == 0, out.stderr[-3000:]
    ratio = float(out.stdout.split("RATIO")[1].split()[0])
    assert "USED 50000 SPARE_ZERO True" in out.stdout, out.stdout
    assert ratio < 0.3, f"RSS grew by {ratio:.2f}x the table's allocated variables"


@needs_kernels
@settings(max_examples=25, deadline=None)
@given(
    have=st.integers(0, 40_000),
    extra=st.integers(0, 70_000),
    width=st.sampled_from([1, 3, 16]),
    dtype=st.sampled_from([tf.float32, tf.bfloat16, tf.float16, tf.int32, tf.int64]),
)
def test_pad_rows_is_concat_with_zeros_on_recycled_memory(have, extra, width, dtype):
    # The padding must read as zeros whatever the allocator hands back: freed
    # buffers of the same size (from the same allocator) full of threes come first.
    with kernel_path(True):
        for _ in range(3):
            threes = tf.fill([have + extra, width], tf.constant(3, dtype))
            junk = kernel_ops.pad_rows(threes, have + extra)
            del junk
        x = tf.cast(tf.random.uniform([have, width], 1, 100, tf.int32), dtype)
        got = kernel_ops.pad_rows(x, have + extra)
    want = tf.concat([x, tf.zeros([extra, width], dtype)], 0)
    assert got.dtype == dtype and got.shape == (have + extra, width)
    np.testing.assert_array_equal(got.numpy().astype(np.float64), want.numpy().astype(np.float64))


# --------------------------------------------------------------- build and fallback
def _python(code: str, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
        start_new_session=True,
        check=False,
    )


_TRAIN_AND_REPORT = """
    import numpy as np, tensorflow as tf
    import npu_rec
    from npu_rec._kernels import _ops
    t = npu_rec.create_table("f", 4, optimizer=npu_rec.optimizers.SGD(0.5))
    ids = tf.constant([1, 2, 2, 3], tf.int64)
    npu_rec.sparse_lookup(t, ids)
    t.apply_gradients(ids, tf.ones([4, 4]))
    npu_rec.sparse_lookup(t, tf.constant([5], tf.int64))
    print("ENABLED", _ops.enabled(), "SIZE", t.size())
"""


def test_without_a_compiler_tables_use_the_stock_path_with_one_log_line(tmp_path):
    done = _python(
        _TRAIN_AND_REPORT,
        {"CXX": "/nonexistent", "NPU_REC_KERNELS": "auto", "NPU_REC_KERNEL_CACHE": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ENABLED False SIZE 4" in done.stdout
    lines = [ln for ln in done.stderr.splitlines() if "table kernels unavailable" in ln]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "/nonexistent" in lines[0] and "install a C++ compiler" in lines[0]
    assert os.listdir(tmp_path) == []  # no half-written library left behind


def test_environment_variable_forces_either_path(tmp_path):
    envs = [
        {"NPU_REC_KERNELS": "off", "NPU_REC_KERNEL_CACHE": str(tmp_path / "off")},
        {
            "NPU_REC_KERNELS": "on",
            "CXX": "/nonexistent",
            "NPU_REC_KERNEL_CACHE": str(tmp_path / "on"),
        },
    ]
    # Two independent processes, run side by side (each mostly imports TensorFlow).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        off, must = pool.map(lambda env: _python(_TRAIN_AND_REPORT, env), envs)
    assert off.returncode == 0, off.stderr[-3000:]
    assert "ENABLED False SIZE 4" in off.stdout
    assert "table kernels" not in off.stderr  # a choice, not a failure: no warning
    assert not os.path.exists(tmp_path / "off")  # and no build
    assert must.returncode != 0
    assert "NPU_REC_KERNELS=on, but npu_rec's table kernels could not be built" in must.stderr


def test_unknown_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("NPU_REC_KERNELS", "fast")
    with pytest.raises(
        ValueError,
        match=r"NPU_REC_KERNELS must be one of \('auto', 'on', "
        r"'off'\)\. Received: NPU_REC_KERNELS='fast'",
    ):
        _build.mode()


@needs_kernels
def test_concurrent_builds_never_load_a_half_written_library(tmp_path):
    """Two processes build into one empty cache with a slow compiler; both load a whole file.

    The "compiler" writes the real library (from the test session's cache) to
    its `-o` path in small pieces, pausing between them, and the two runs overlap.
    """
    fake = tmp_path / "slow-cxx"
    fake.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, time
        out = sys.argv[sys.argv.index("-o") + 1]
        data = open({_build.library_path()!r}, "rb").read()
        with open(out, "wb") as f:
            for i in range(0, len(data), len(data) // 8 + 1):
                f.write(data[i:i + len(data) // 8 + 1]); f.flush(); time.sleep(0.2)
        """)
    )
    fake.chmod(0o755)
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": ROOT,
        "CXX": str(fake),
        "NPU_REC_KERNELS": "on",
        "NPU_REC_KERNEL_CACHE": str(tmp_path / "cache"),
    }
    code = textwrap.dedent(_TRAIN_AND_REPORT)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "ENABLED True SIZE 4" in out
    left = os.listdir(tmp_path / "cache")
    assert len(left) == 1 and left[0].endswith(".so") and not left[0].startswith(".build-")


@needs_kernels
def test_a_build_compiles_the_sources_it_hashed_and_stops_at_the_first_failure(tmp_path):
    # The library is cached under the hash of the bytes read at the start; the build
    # compiles those bytes (copied aside), not the files on disk, which an editor may
    # change while the compilers run. One source fails at once here: the others'
    # compilers (each a few seconds of TensorFlow headers) are stopped, not waited for.
    files = _build._read_sources()
    files["key_map.cc"] = b'#include "edited_after_hashing.h"\n' + files["key_map.cc"]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"key_map\.cc -o") as err:
        _build.build(str(tmp_path / "lib.so"), files)
    assert "edited_after_hashing.h: No such file" in str(err.value)
    assert time.monotonic() - start < 15
    assert os.listdir(tmp_path) == []  # neither a library nor the build directory left
    assert _build._cached_name(files) != _build.library_path()
