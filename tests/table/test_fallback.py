"""`not_admitted="hashed"`: the trained fallback of keys below the admission threshold.

A NumPy model of the table (per-key sighting counts, own rows of admitted
keys, one fallback row per bucket, plain SGD) is the reference: a key below
`access_threshold` reads and trains row `bucket(key)` of the fallback, and
the row a key gets at admission is its fallback row's value at that moment.
Both lookup paths (stock ops and the compiled kernels) and sharded tables
must follow it.
"""

import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec._kernels import _build
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.table._fallback import bucket_of, bucket_of_numpy

HAVE_CXX = shutil.which(os.environ.get("CXX") or "g++") is not None
PATHS = [
    pytest.param(False, id="stock"),
    pytest.param(
        True,
        id="kernels",
        marks=pytest.mark.skipif(
            not HAVE_CXX or os.environ.get("NPU_REC_KERNELS") == "off",
            reason="the kernel path is not built",
        ),
    ),
]
LR = 0.25


class FallbackModel:
    """NumPy reference: counts, admitted rows and fallback rows under SGD(LR)."""

    def __init__(self, fallback0: np.ndarray, threshold: int):
        self.fallback = fallback0.astype(np.float64).copy()
        self.buckets = len(fallback0)
        self.threshold = threshold
        self.counts: dict[int, int] = {}
        self.rows: dict[int, np.ndarray] = {}

    def step(self, ids: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """The embeddings a training lookup of `ids` reads; then applies `grads` [n, dim]."""
        for key in np.unique(ids):
            key = int(key)
            if key in self.rows:
                continue
            self.counts[key] = self.counts.get(key, 0) + int(np.sum(ids == key))
            if self.counts[key] >= self.threshold:  # admitted: starts from its fallback row
                self.rows[key] = self.fallback[bucket_of_numpy([key], self.buckets)[0]].copy()
        buckets = bucket_of_numpy(ids, self.buckets)
        emb = np.stack(
            [
                self.rows[int(k)] if int(k) in self.rows else self.fallback[b]
                for k, b in zip(ids, buckets, strict=True)
            ]
        )
        new_fallback = self.fallback.copy()
        for k, b, g in zip(ids, buckets, grads, strict=True):
            if int(k) in self.rows:
                self.rows[int(k)] = self.rows[int(k)] - LR * g
            else:
                new_fallback[b] -= LR * g
        self.fallback = new_fallback
        return emb


def _table(name, dim, threshold, buckets, num_shards=1, **kwargs):
    return npu_rec.create_table(
        name,
        dim,
        optimizer=npu_rec.optimizers.SGD(LR),
        access_threshold=threshold,
        not_admitted="hashed",
        fallback_buckets=buckets,
        num_shards=num_shards,
        **kwargs,
    )


@pytest.mark.parametrize("kernels", PATHS)
@pytest.mark.parametrize("num_shards", [1, 3])
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    threshold=st.integers(2, 4),
    buckets=st.sampled_from([1, 3, 16]),
    batches=st.lists(
        st.lists(st.integers(-6, 12), min_size=1, max_size=10), min_size=1, max_size=5
    ),
    seed=st.integers(0, 2**16),
)
def test_reads_writes_and_admission_follow_the_numpy_model(
    kernels, num_shards, threshold, buckets, batches, seed
):
    from npu_rec.table import _registry

    _registry.clear()
    rng = np.random.default_rng(seed)
    dim = 3
    with _build.forced(kernels):
        table = _table("fb", dim, threshold, buckets, num_shards)
    assert table.backend.name == ("kernels" if kernels else "stock")
    model = FallbackModel(table.fallback.values.numpy(), threshold)
    for batch in batches:
        ids = np.asarray(batch, np.int64)
        weights = rng.normal(size=(len(ids), dim)).astype(np.float32)
        with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
            emb = npu_rec.sparse_lookup(table, tf.constant(ids))
            loss = tf.reduce_sum(emb * weights)
        grads = tape.gradient(loss, [r.embeddings for r in records])
        npu_rec.apply_recorded_gradients(records, grads)
        want = model.step(ids, weights)
        np.testing.assert_allclose(emb.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table.fallback.values.numpy(), model.fallback, rtol=1e-5, atol=1e-5)
    got = table.export()
    assert sorted(got["keys"].tolist()) == sorted(model.rows)
    for key, value in zip(got["keys"], got["values"], strict=True):
        np.testing.assert_allclose(value, model.rows[int(key)], rtol=1e-5, atol=1e-5)
    # A lookup without training reads the same: own rows, else the fallback row.
    probe = np.arange(-8, 15, dtype=np.int64)
    served = npu_rec.sparse_lookup(table, tf.constant(probe), is_training=False).numpy()
    fb = model.fallback[bucket_of_numpy(probe, buckets)]
    want = np.stack([model.rows.get(int(k), f) for k, f in zip(probe, fb, strict=True)])
    np.testing.assert_allclose(served, want, rtol=1e-5, atol=1e-5)


def test_bucket_of_matches_its_numpy_twin_and_spreads_keys():
    keys = np.array([0, 1, -1, 2**62, -(2**63), 2**63 - 1, 12345], np.int64)
    for buckets in (1, 7, 1 << 20):
        np.testing.assert_array_equal(
            bucket_of(tf.constant(keys), buckets).numpy(), bucket_of_numpy(keys, buckets)
        )
    hist = np.bincount(bucket_of_numpy(np.arange(40000), 8), minlength=8)
    assert hist.min() > 4500  # about 5000 each


def test_admitted_row_starts_from_the_trained_fallback_row_not_the_initializer():
    table = _table("user", 4, threshold=2, buckets=5, initializer="zeros")
    assert np.all(table.fallback.values.numpy() == 0)  # the fallback starts from the initializer
    ids = tf.constant([7], tf.int64)
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
        loss = tf.reduce_sum(npu_rec.sparse_lookup(table, ids) * [1.0, 2.0, 3.0, 4.0])
    npu_rec.apply_recorded_gradients(records, tape.gradient(loss, [records[0].embeddings]))
    assert table.size() == 0
    trained = table.fallback.values.numpy()[bucket_of_numpy([7], 5)[0]]
    np.testing.assert_allclose(trained, -LR * np.array([1.0, 2.0, 3.0, 4.0]))
    emb = npu_rec.sparse_lookup(table, ids)  # second sighting: admitted
    assert table.size() == 1
    np.testing.assert_allclose(emb.numpy()[0], trained)
    np.testing.assert_allclose(table.export()["values"][0], trained)


def test_apply_gradients_trains_the_fallback_of_ids_without_a_row():
    table = _table("t", 2, threshold=3, buckets=4)
    before = table.fallback.values.numpy().copy()
    ids = tf.constant([5, 5, 6], tf.int64)
    npu_rec.sparse_lookup(table, ids)
    table.apply_gradients(ids, tf.ones([3, 2]))
    want = before.copy()
    for key in (5, 5, 6):
        want[bucket_of_numpy([key], 4)[0]] -= LR
    np.testing.assert_allclose(table.fallback.values.numpy(), want, rtol=1e-6)


def test_fallback_uses_the_tables_optimizer_with_its_own_slots():
    table = npu_rec.create_table(
        "ada",
        2,
        optimizer=npu_rec.optimizers.Adagrad(0.1, initial_accumulator_value=0.5),
        access_threshold=5,
        not_admitted="hashed",
        fallback_buckets=3,
    )
    assert sorted(table.fallback.slots) == table.slot_names == ["accumulator"]
    before = table.fallback.values.numpy().copy()
    ids = tf.constant([11], tf.int64)
    npu_rec.sparse_lookup(table, ids)
    table.apply_gradients(ids, tf.constant([[2.0, -1.0]]))
    b = bucket_of_numpy([11], 3)[0]
    acc = 0.5 + np.array([4.0, 1.0])
    np.testing.assert_allclose(table.fallback.slots["accumulator"].numpy()[b], acc, rtol=1e-6)
    np.testing.assert_allclose(
        table.fallback.values.numpy()[b],
        before[b] - 0.1 * np.array([2.0, -1.0]) / np.sqrt(acc),
        rtol=1e-5,
    )


def test_memory_stats_count_the_fallback_rows_and_slots():
    kwargs = dict(optimizer=npu_rec.optimizers.Adagrad(0.1), capacity=64, access_threshold=2)
    plain = npu_rec.create_table("mem_zeros", 4, **kwargs)
    hashed = npu_rec.create_table(
        "mem_hashed", 4, not_admitted="hashed", fallback_buckets=100, **kwargs
    )
    without, with_ = plain.memory_stats(), hashed.memory_stats()
    assert without["fallback"] == 0
    # rows and Adagrad accumulators of 100 x 4 float32, plus the int64 step counter
    assert with_["fallback"] == 2 * 100 * 4 * 4 + 8
    assert with_["total_bytes"] == without["total_bytes"] + with_["fallback"]


def test_an_optimizer_bound_later_gets_fallback_slots_too():
    table = npu_rec.create_table(
        "late", 2, access_threshold=2, not_admitted="hashed", fallback_buckets=3
    )
    table.bind_optimizer(npu_rec.optimizers.Adam(0.01))
    assert sorted(table.fallback.slots) == sorted(table.slot_names)
    ids = tf.constant([1], tf.int64)
    npu_rec.sparse_lookup(table, ids)
    table.apply_gradients(ids, tf.ones([1, 2]))
    assert int(table.fallback.step.numpy()) == 1


def test_default_not_admitted_keys_read_zeros_and_own_no_fallback():
    table = npu_rec.create_table("z", 3, optimizer=npu_rec.optimizers.SGD(0.1), access_threshold=2)
    assert table.fallback is None and table.config.not_admitted == "zeros"
    emb = npu_rec.sparse_lookup(table, tf.constant([1, 2], tf.int64))
    assert np.all(emb.numpy() == 0)
    assert not any(k.startswith("fallback/") for k in table.read_state())


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"not_admitted": "hash"},
            ValueError,
            r"`not_admitted` must be one of.*not_admitted='hash'",
        ),
        ({"not_admitted": None}, ValueError, r"`not_admitted` must be one of.*not_admitted=None"),
        ({"fallback_buckets": 0}, ValueError, r"`fallback_buckets` must be an integer >= 1.*=0"),
        ({"fallback_buckets": 2.5}, TypeError, r"`fallback_buckets`.*=2.5 of type float"),
        ({"fallback_buckets": True}, TypeError, r"`fallback_buckets`.*of type bool"),
        (
            {"not_admitted": "hashed", "access_threshold": 1},
            ValueError,
            r"`access_threshold` must be >= 2.*not_admitted='hashed', access_threshold=1",
        ),
        (
            {"not_admitted": "hashed", "access_threshold": -1},
            ValueError,
            r"access_threshold=-1",
        ),
    ],
)
def test_bad_fallback_arguments_name_the_argument_the_rule_and_the_value(kwargs, error, match):
    kwargs = {"access_threshold": 3, **kwargs}
    with pytest.raises(error, match=match):
        npu_rec.create_table("bad", 4, **kwargs)


# ------------------------------------------------------------- checkpoints
def _train(table, steps=3, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = tf.constant(rng.integers(0, 40, size=8), tf.int64)
        npu_rec.sparse_lookup(table, ids)
        table.apply_gradients(ids, tf.constant(rng.normal(size=(8, table.dim)), tf.float32))


@pytest.mark.parametrize("num_shards", [1, 2])
def test_checkpoints_round_trip_the_fallback_in_full_and_delta_saves(tmp_path, num_shards):
    table = _table("ck", 3, threshold=3, buckets=8, num_shards=num_shards)
    manager = TableCheckpointManager(str(tmp_path), [table])
    _train(table)
    manager.save(1)
    _train(table, seed=1)
    manager.save(2, delta=True)
    want = table.read_state()
    _train(table, seed=2)
    assert not np.allclose(table.fallback.values.numpy(), want["fallback/values"])
    manager.restore(2)
    got = table.read_state()
    for key in ("fallback/values", "fallback/step", "keys", "values", "pending_keys"):
        np.testing.assert_array_equal(got[key], want[key])


def test_a_checkpoint_without_fallback_restores_into_a_hashed_table_from_its_initial_rows(
    tmp_path, caplog
):
    zeros = npu_rec.create_table("a", 3, optimizer=npu_rec.optimizers.SGD(LR), access_threshold=3)
    _train(zeros)
    zeros.save(str(tmp_path / "a.nrc"))
    npu_rec.table._registry.clear()
    hashed = _table("a", 3, threshold=3, buckets=8)
    initial = hashed.fallback.values.numpy().copy()
    _train(hashed)
    with caplog.at_level(logging.INFO, logger="absl"):  # npu_rec logs through absl's logger
        hashed.restore(str(tmp_path / "a.nrc"))
    assert "no fallback rows" in caplog.text and "initial rows" in caplog.text
    np.testing.assert_array_equal(hashed.fallback.values.numpy(), initial)
    assert int(hashed.fallback.step.numpy()) == 0
    np.testing.assert_array_equal(hashed.export()["keys"], zeros.export()["keys"])


def test_a_checkpoint_with_fallback_restores_into_a_zeros_table_without_it(tmp_path, caplog):
    hashed = _table("b", 3, threshold=3, buckets=8)
    _train(hashed)
    hashed.save(str(tmp_path / "b.nrc"))
    npu_rec.table._registry.clear()
    zeros = npu_rec.create_table("b", 3, optimizer=npu_rec.optimizers.SGD(LR), access_threshold=3)
    with caplog.at_level(logging.INFO, logger="absl"):  # npu_rec logs through absl's logger
        zeros.restore(str(tmp_path / "b.nrc"))
    assert "not_admitted='zeros'" in caplog.text
    assert zeros.fallback is None
    want = hashed.export()
    np.testing.assert_array_equal(zeros.export()["values"], want["values"])


def test_other_bucket_count_restores_the_fallback_from_its_initial_rows(tmp_path, caplog):
    _train(_table("c", 3, threshold=3, buckets=8))
    npu_rec.table._registry.get("c").save(str(tmp_path / "c.nrc"))
    npu_rec.table._registry.clear()
    table = _table("c", 3, threshold=3, buckets=5)
    initial = table.fallback.values.numpy().copy()
    with caplog.at_level(logging.INFO, logger="absl"):  # npu_rec logs through absl's logger
        table.restore(str(tmp_path / "c.nrc"))
    assert "shape (8, 3)" in caplog.text
    np.testing.assert_array_equal(table.fallback.values.numpy(), initial)


def test_graph_mode_lookup_training_and_checkpoint(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        table = _table("g", 2, threshold=2, buckets=4)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = npu_rec.sparse_lookup(table, ids)
        records = tf.compat.v1.get_collection(npu_rec.LOOKUP_COLLECTION)
        grads = tf.gradients(tf.reduce_sum(emb), [r.embeddings for r in records])
        train = npu_rec.apply_recorded_gradients(records, grads)
        manager = TableCheckpointManager(str(tmp_path), [table])
        init = tf.compat.v1.global_variables_initializer()
        size = table.size()
        graph.finalize()
        with tf.compat.v1.Session() as sess:
            sess.run(init)
            before = sess.run(table.fallback.values)
            out, _ = sess.run([emb, train], {ids: [3]})
            b = bucket_of_numpy([3], 4)[0]
            np.testing.assert_allclose(out[0], before[b])
            after = sess.run(table.fallback.values)
            np.testing.assert_allclose(after[b], before[b] - LR)
            manager.save(1, session=sess)
            sess.run(train, {ids: [3, 9]})  # admits 3 from its fallback row
            assert sess.run(size) == 1
            manager.restore(1, session=sess)
            np.testing.assert_allclose(sess.run(table.fallback.values), after)
            assert sess.run(size) == 0


def test_on_the_parameter_server_route_the_fallback_lives_beside_shard_0():
    from npu_rec.distribute import _ps

    with tf.Graph().as_default(), _ps.table_placement(2):
        table = _table("ps", 2, threshold=2, buckets=4)
        assert table.num_shards == 2
        shard_devices = [s.storage.values.device for s in table.shards]
        assert shard_devices[0] != shard_devices[1]
        for var in table.fallback.variables():
            assert var.device == shard_devices[0]
        assert set(table.fallback.variables()) <= set(table.variables())


def test_a_hashed_table_without_optimizer_says_so_when_gradients_are_applied():
    table = npu_rec.create_table("noopt", 2, access_threshold=2, not_admitted="hashed")
    ids = tf.constant([1, 2], tf.int64)
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as records:
        loss = tf.reduce_sum(npu_rec.sparse_lookup(table, ids))
    grads = tape.gradient(loss, [r.embeddings for r in records])
    with pytest.raises(ValueError, match="has no optimizer"):
        npu_rec.apply_recorded_gradients(records, grads)
    with pytest.raises(ValueError, match="has no optimizer"):
        table.apply_gradients(ids, tf.ones([2, 2]))
