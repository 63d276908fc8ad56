"""Unit tests of create_table / SparseTable / sparse_lookup behaviour."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.table import _registry as _table_registry
from tests.table.table_reference import keyed_uniform


def test_lookup_reads_keyed_initial_rows_and_counts():
    table = npu_rec.create_table("t", 4)
    ids = tf.constant([[5, 9], [5, 2**40]], tf.int64)
    emb = npu_rec.sparse_lookup(table, ids)
    assert emb.shape == (2, 2, 4)
    np.testing.assert_allclose(emb[0, 0], keyed_uniform(5, 4, "t"))
    np.testing.assert_allclose(emb[1, 1], keyed_uniform(2**40, 4, "t"))
    np.testing.assert_array_equal(emb[0, 0], emb[1, 0])
    out = table.export()
    np.testing.assert_array_equal(out["keys"], [5, 9, 2**40])
    np.testing.assert_array_equal(out["counts"], [2, 1, 1])
    assert int(table.size()) == 3


def test_int32_keys_and_inference_lookup_of_unknown_keys():
    table = npu_rec.create_table("t32", 2, key_dtype=tf.int32)
    npu_rec.sparse_lookup(table, tf.constant([-7, 3], tf.int32))
    got = npu_rec.sparse_lookup(table, tf.constant([3, 4], tf.int32), is_training=False)
    np.testing.assert_allclose(got[0], keyed_uniform(3, 2, "t32"))
    np.testing.assert_array_equal(got[1], [0.0, 0.0])
    assert table.export()["keys"].dtype == np.int32
    assert int(table.size()) == 2


def test_duplicate_table_name_is_rejected_and_registry_clear_allows_reuse():
    npu_rec.create_table("dup", 2)
    with pytest.raises(ValueError, match="'dup' already exists"):
        npu_rec.create_table("dup", 2)
    _table_registry.clear()
    npu_rec.create_table("dup", 2)


def test_same_name_in_two_v1_graphs_is_allowed():
    for _ in range(2):
        with tf.Graph().as_default():
            npu_rec.create_table("per_graph", 2)
            with pytest.raises(ValueError, match="per_graph"):
                npu_rec.create_table("per_graph", 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dim": 0}, "`dim` must be an integer >= 1. Received: dim=0"),
        ({"dim": True}, "`dim`"),
        ({"access_threshold": -2}, "`access_threshold` must be an integer >= -1"),
        ({"eviction_threshold": 5}, "eviction_threshold=5, access_threshold=-1"),
        ({"capacity": 0}, "`capacity`"),
    ],
)
def test_bad_arguments_name_argument_rule_and_value(kwargs, match):
    args = {"name": "bad", "dim": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        npu_rec.create_table(**args)


def test_wrong_optimizer_type_is_a_type_error():
    with pytest.raises(TypeError, match="`optimizer`"):
        npu_rec.create_table("o", 2, optimizer="adam")


def test_fixed_capacity_full_error_names_table_and_capacity_and_keeps_state():
    table = npu_rec.create_table("small", 2, capacity=3, dynamic_expansion=False)
    npu_rec.sparse_lookup(table, tf.constant([1, 2], tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"'small' is full: its capacity is 3 rows.*Raise `capacity`",
    ):
        npu_rec.sparse_lookup(table, tf.constant([3, 4], tf.int64))
    np.testing.assert_array_equal(table.export()["keys"], [1, 2])
    npu_rec.sparse_lookup(table, tf.constant([3], tf.int64))
    assert int(table.size()) == 3


def test_dynamic_expansion_grows_inside_tf_function_and_keeps_rows():
    table = npu_rec.create_table("grow", 2, capacity=2, dynamic_expansion=True)

    @tf.function
    def look(ids):
        return npu_rec.sparse_lookup(table, ids)

    first = look(tf.constant([10, 11], tf.int64)).numpy()
    look(tf.constant(np.arange(100, 150), tf.int64))
    assert int(table.size()) == 52
    assert int(table.storage.capacity()) == 52  # max(needed, 2 * capacity)
    np.testing.assert_array_equal(look(tf.constant([10, 11], tf.int64)).numpy(), first)


def test_admission_reads_zero_until_threshold_then_updates():
    table = npu_rec.create_table(
        "adm", 2, optimizer=npu_rec.optimizers.SGD(1.0), access_threshold=3
    )
    ids = tf.constant([7, 7], tf.int64)
    emb = npu_rec.sparse_lookup(table, ids)
    np.testing.assert_array_equal(emb.numpy(), np.zeros((2, 2)))
    table.apply_gradients(ids, tf.ones([2, 2]))
    assert int(table.size()) == 0
    emb = npu_rec.sparse_lookup(table, tf.constant([7], tf.int64))
    np.testing.assert_allclose(emb[0], keyed_uniform(7, 2, "adm"))
    assert table.export()["counts"].tolist() == [3]


def test_evict_frees_idle_rows_and_reuses_them():
    table = npu_rec.create_table(
        "ev", 2, access_threshold=0, eviction_threshold=10, capacity=3, dynamic_expansion=False
    )
    npu_rec.sparse_lookup(
        table, tf.constant([[1], [2]], tf.int64), timestamps=tf.constant([100, 105], tf.int64)
    )
    npu_rec.sparse_lookup(table, tf.constant([3], tf.int64), timestamps=tf.constant([108]))
    assert table.evict(now=112) == 1  # key 1 idle 12 s > 10 s
    np.testing.assert_array_equal(table.export()["keys"], [2, 3])
    np.testing.assert_array_equal(table.export()["last_seen"], [105, 108])
    npu_rec.sparse_lookup(table, tf.constant([4], tf.int64), timestamps=tf.constant([120]))
    assert int(table.size()) == 3  # reused the freed row within capacity 3
    assert table.evict() == 2  # now = newest timestamp seen (120)


def test_freed_rows_are_never_evicted_twice_and_reused_rows_start_fresh():
    table = npu_rec.create_table(
        "ev2", 2, access_threshold=0, eviction_threshold=50, capacity=4, dynamic_expansion=False
    )
    npu_rec.sparse_lookup(
        table, tf.constant([1, 2], tf.int64), timestamps=tf.constant([0, 500], tf.int64)
    )
    assert table.evict(now=100) == 1  # key 1
    assert table.evict(now=120) == 0  # its freed row is not idle
    assert table.evict(now=10**6) == 1  # key 2
    assert table.evict(now=2 * 10**6) == 0 and int(table.size()) == 0
    npu_rec.sparse_lookup(
        table,
        tf.constant([7, 7, 8], tf.int64),
        timestamps=tf.constant([3000, 3010, 3005], tf.int64),
    )
    out = table.export()
    np.testing.assert_array_equal(out["counts"], [2, 1])  # no count left from 1 or 2
    np.testing.assert_array_equal(out["last_seen"], [3010, 3005])
    assert table.evict(now=3056) == 1  # key 8 only (idle 51 s)
    np.testing.assert_array_equal(table.export()["keys"], [7])


def test_evict_without_timestamp_feature_uses_wall_clock():
    table = npu_rec.create_table("wall", 2, access_threshold=0, eviction_threshold=1000)
    npu_rec.sparse_lookup(table, tf.constant([1], tf.int64))
    assert table.evict() == 0
    assert table.evict(now=int(tf.timestamp()) + 5000) == 1


def test_evicting_many_tables_logs_no_retracing_warning():
    """Each table compiles its eager evict once; a model's worth of tables must not set
    off TensorFlow's "excessive retracing" warning (it names `build_evict`)."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tf.get_logger().addHandler(handler)
    try:
        for i in range(8):
            table = npu_rec.create_table(f"many{i}", 2, access_threshold=0, eviction_threshold=10)
            npu_rec.sparse_lookup(
                table, tf.constant([i], tf.int64), timestamps=tf.constant([100], tf.int64)
            )
            assert table.evict(now=200) == 1
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [r for r in records if "retracing" in r.getMessage()]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_ragged_and_sparse_combiners(combiner):
    table = npu_rec.create_table(f"c_{combiner}", 3)
    ragged = tf.ragged.constant([[1, 2, 2], [], [3]], dtype=tf.int64)
    got = npu_rec.sparse_lookup(table, ragged, combiner=combiner).numpy()
    rows = {k: keyed_uniform(k, 3, f"c_{combiner}") for k in (1, 2, 3)}
    norm = {"sum": lambda n: 1.0, "mean": lambda n: n, "sqrtn": np.sqrt}[combiner]
    want = np.stack([(rows[1] + 2 * rows[2]) / norm(3), np.zeros(3), rows[3] / norm(1)])
    np.testing.assert_allclose(got, want, atol=1e-6)
    sparse = ragged.to_sparse()
    np.testing.assert_allclose(
        npu_rec.sparse_lookup(table, sparse, combiner=combiner).numpy(), want, atol=1e-6
    )
    dense = tf.constant([[1, 2, 2]], tf.int64)
    np.testing.assert_allclose(
        npu_rec.sparse_lookup(table, dense, combiner=combiner).numpy(), want[:1], atol=1e-6
    )


def test_ragged_without_combiner_and_sparse_requires_combiner():
    table = npu_rec.create_table("rag", 2)
    ragged = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    out = npu_rec.sparse_lookup(table, ragged)
    assert isinstance(out, tf.RaggedTensor) and out.shape[-1] == 2
    with pytest.raises(ValueError, match="combiner"):
        npu_rec.sparse_lookup(table, ragged.to_sparse())


def test_per_example_timestamps_for_ragged_ids():
    table = npu_rec.create_table("ts", 2, access_threshold=0, eviction_threshold=5)
    ragged = tf.ragged.constant([[1, 2], [2, 3]], dtype=tf.int64)
    npu_rec.sparse_lookup(table, ragged, combiner="sum", timestamps=tf.constant([10, 20]))
    np.testing.assert_array_equal(table.export()["last_seen"], [10, 20, 20])


def test_contract_tape_usage_sums_duplicate_gradients():
    table = npu_rec.create_table("tape", 2, optimizer=npu_rec.optimizers.SGD(0.5))
    ids = tf.constant([4, 4, 6], tf.int64)
    with tf.GradientTape() as tape:
        emb = npu_rec.sparse_lookup(table, ids)
        tape.watch(emb)
        loss = tf.reduce_sum(emb * tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    table.apply_gradients(ids, tape.gradient(loss, emb))
    out = table.export()
    np.testing.assert_allclose(
        out["values"][0], keyed_uniform(4, 2, "tape") - 0.5 * np.array([4.0, 6.0]), atol=1e-6
    )
    np.testing.assert_allclose(
        out["values"][1], keyed_uniform(6, 2, "tape") - 0.5 * np.array([5.0, 6.0]), atol=1e-6
    )


def test_apply_without_optimizer_explains():
    table = npu_rec.create_table("noopt", 2)
    with pytest.raises(ValueError, match="has no optimizer"):
        table.apply_gradients(tf.constant([1], tf.int64), tf.ones([1, 2]))


def test_user_initializer_is_used():
    table = npu_rec.create_table("init", 3, initializer=tf.keras.initializers.Constant(0.25))
    emb = npu_rec.sparse_lookup(table, tf.constant([1], tf.int64))
    np.testing.assert_allclose(emb.numpy(), np.full((1, 3), 0.25))


def test_initializer_by_keras_name():
    table = npu_rec.create_table("ones", 2, initializer="ones")
    np.testing.assert_array_equal(
        npu_rec.sparse_lookup(table, tf.constant([9], tf.int64)).numpy(), [[1.0, 1.0]]
    )
    with pytest.raises(ValueError, match="initializer='nope'"):
        npu_rec.create_table("nope", 2, initializer="nope")


def test_fan_based_initializer_makes_rows_in_a_function():
    table = npu_rec.create_table("glorot", 2, capacity=6, initializer="glorot_uniform")
    emb = tf.function(lambda ids: npu_rec.sparse_lookup(table, ids))(tf.constant([1], tf.int64))
    limit = np.sqrt(6.0 / (6 + 2))  # sized as a [capacity, dim] variable
    assert emb.shape == (1, 2) and np.all(np.abs(emb.numpy()) <= limit)


def test_initializer_needing_a_static_shape_is_refused_with_guidance():
    def static_only(shape, dtype):
        return tf.zeros([int(s) for s in shape], dtype)

    table = npu_rec.create_table("static_only", 2, initializer=static_only)
    with pytest.raises(TypeError, match="dynamic number of new keys"):
        tf.function(lambda ids: npu_rec.sparse_lookup(table, ids))(tf.constant([1], tf.int64))


def test_table_variables_are_not_trainable():
    table = npu_rec.create_table("nt", 2, optimizer=npu_rec.optimizers.Adagrad())
    assert table.variables() and not any(v.trainable for v in table.variables())


def test_two_lookups_of_one_table_make_one_optimizer_step():
    from tests.table.table_helpers import OPTIMIZERS, assert_same_state
    from tests.table.table_reference import ReferenceTable

    make_opt, make_ref = OPTIMIZERS["adam"]
    table = npu_rec.create_table("shared", 2, optimizer=make_opt())
    ref = ReferenceTable("shared", 2, make_ref())
    ids_a, ids_b = [1, 2, 2], [2, 3]
    with tf.GradientTape() as tape, npu_rec.record_lookups(tape) as recs:
        ea = npu_rec.sparse_lookup(table, tf.constant(ids_a, tf.int64), timestamps=5)
        eb = npu_rec.sparse_lookup(table, tf.constant(ids_b, tf.int64), timestamps=5)
        loss = tf.reduce_sum(ea * 2.0) + tf.reduce_sum(eb * eb)
    want_b = ref.lookup(ids_a + ids_b, [5] * 5)[3:]
    npu_rec.apply_recorded_gradients(recs, tape.gradient(loss, [r.embeddings for r in recs]))
    ref.apply(ids_a + ids_b, np.concatenate([np.full((3, 2), 2.0), 2 * want_b]))
    assert len(recs) == 2
    assert_same_state(table, ref)


def test_graph_mode_size_and_evict_tensors_without_session():
    with tf.Graph().as_default():
        table = npu_rec.create_table("gt", 2, access_threshold=0, eviction_threshold=1)
        emb = npu_rec.sparse_lookup(table, tf.constant([1, 2], tf.int64), timestamps=10)
        evicted = table.evict()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(emb)
            assert sess.run(table.size()) == 2
            assert sess.run(evicted, {}) == 0  # now = newest timestamp (10)
            assert table.evict(now=20) == 2  # default session runs it
            assert sess.run(table.size()) == 0


def test_shutdown_forgets_tables_so_names_can_be_reused():
    npu_rec.create_table("shutdown_reuse", 4)
    with pytest.raises(ValueError, match="'shutdown_reuse' already exists.*npu_rec.shutdown"):
        npu_rec.create_table("shutdown_reuse", 4)
    npu_rec.shutdown()
    assert npu_rec.create_table("shutdown_reuse", 4).name == "shutdown_reuse"


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sparse_padded_ids_combine_like_ragged_and_padding_gets_no_rows(combiner):
    # The fixed-shape batches of as_dataset(use_dynamic=False): absent entries are the padding.
    padded = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([5, 9, 7], tf.int64), [3, 3])
    ragged = tf.ragged.constant([[5, 9], [7], []], dtype=tf.int64)
    table = npu_rec.create_table(f"pad_{combiner}", 4)
    got = npu_rec.sparse_lookup(table, padded, combiner=combiner)
    want = npu_rec.sparse_lookup(table, ragged, combiner=combiner)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got.numpy()[2], np.zeros(4))
    assert int(table.size()) == 3
    assert sorted(table.export()["keys"].tolist()) == [5, 7, 9]


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 2**40 + 5])
def test_int32_table_refuses_ids_that_do_not_fit_instead_of_wrapping(bad):
    table = npu_rec.create_table(
        "narrow", 2, key_dtype=tf.int32, optimizer=npu_rec.optimizers.SGD(0.1)
    )
    ids = tf.constant([7, bad], tf.int64)
    match = (
        r"'narrow' has key_dtype=int32, so ids must lie in \[-2147483648, 2147483647\].*"
        rf"key_dtype=tf.int64.*out-of-range ids \(first 3\): \[?{bad}"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        npu_rec.sparse_lookup(table, ids)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        npu_rec.sparse_lookup(table, ids, is_training=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        table.apply_gradients(ids, tf.ones([2, 2]))
    assert int(table.size()) == 0
    npu_rec.sparse_lookup(table, tf.constant([7, 2**31 - 1, -(2**31)], tf.int64))
    assert sorted(table.export()["keys"].tolist()) == [-(2**31), 7, 2**31 - 1]


def test_int32_table_refuses_wide_ids_in_graphs():
    table = npu_rec.create_table("narrow_fn", 2, key_dtype=tf.int32)
    lookup = tf.function(lambda ids: npu_rec.sparse_lookup(table, ids))
    with pytest.raises(tf.errors.InvalidArgumentError, match="narrow_fn.*4294967296"):
        lookup(tf.constant([1, 2**32], tf.int64))
    assert int(table.size()) == 0
    with tf.Graph().as_default():
        graph_table = npu_rec.create_table("narrow_v1", 2, key_dtype=tf.int32)
        emb = npu_rec.sparse_lookup(graph_table, tf.constant([3, -(2**33)], tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError, match="narrow_v1.*-8589934592"):
                sess.run(emb)


@pytest.mark.parametrize("outlier", [2**63 - 1, 1_700_000_000_000])  # INT64_MAX, milliseconds
@pytest.mark.parametrize("per_id", [True, False])
def test_outlier_timestamp_is_clamped_to_the_clock_and_counted(outlier, per_id, caplog):
    table = npu_rec.create_table(f"clock_{per_id}", 2, access_threshold=0, eviction_threshold=100)
    npu_rec.sparse_lookup(
        table,
        tf.constant([1, 2, 3], tf.int64),
        timestamps=tf.constant([1000, 1010, 1020], tf.int64),
    )
    if per_id:
        npu_rec.sparse_lookup(
            table, tf.constant([2, 4], tf.int64), timestamps=tf.constant([1030, outlier], tf.int64)
        )
    else:
        npu_rec.sparse_lookup(table, tf.constant([4], tf.int64), timestamps=outlier)
    with caplog.at_level("WARNING"):
        assert table.evict() == 0  # now = the clock, 1030 or 1020
    assert f"'clock_{per_id}' replaced 1 training timestamps" in caplog.text
    assert str(outlier) in caplog.text
    exported = table.export()
    assert exported["keys"].tolist() == [1, 2, 3, 4]
    assert exported["last_seen"].max() < 2000  # key 4 got the clock, not the outlier
    caplog.clear()
    with caplog.at_level("WARNING"):
        table.evict()
    assert "replaced" not in caplog.text  # counted once
    assert table.evict(now=1131) == 4


def test_outlier_timestamps_in_a_v1_graph_are_counted_and_warned(caplog):
    with tf.Graph().as_default():
        table = npu_rec.create_table(
            "clock_v1", 2, access_threshold=0, eviction_threshold=100, num_shards=2
        )
        ts = tf.compat.v1.placeholder(tf.int64, [None])
        emb = npu_rec.sparse_lookup(table, tf.constant([1, 2, 3], tf.int64), timestamps=ts)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(emb, {ts: [500, 510, 520]})
            sess.run(emb, {ts: [530, 2**62, 2**61]})
            with caplog.at_level("WARNING"):
                assert table.evict(session=sess) == 0
            assert sess.run(table.size()) == 3
    assert "'clock_v1' replaced 2 training timestamps" in caplog.text


@pytest.mark.parametrize("num_shards", [1, 3])
def test_size_is_an_int_in_eager_mode_and_a_tensor_in_graphs(num_shards):
    table = npu_rec.create_table(f"size_{num_shards}", 2, num_shards=num_shards)
    npu_rec.sparse_lookup(table, tf.constant([1, 2, 3, 3], tf.int64))
    eager = table.size()
    assert type(eager) is int and eager == 3
    assert repr(eager) == "3"  # what a user printing it sees

    traced = tf.function(lambda: table.size())
    assert isinstance(traced.get_concrete_function().structured_outputs, tf.Tensor)
    assert int(traced()) == 3


def test_size_is_a_tensor_in_a_v1_graph():
    with tf.Graph().as_default():
        table = npu_rec.create_table("size_graph", 2, num_shards=2)
        emb = npu_rec.sparse_lookup(table, tf.constant([4, 5], tf.int64))
        size = table.size()
        assert isinstance(size, tf.Tensor)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(emb)
            assert sess.run(size) == 2


def _evictor_tables(prefix):
    """Three tables (one sharded, one with eviction off) with rows seen at 100 and 200,
    and a clamped timestamp in the first."""
    tables = [
        npu_rec.create_table(f"{prefix}_a", 2, access_threshold=0, eviction_threshold=50),
        npu_rec.create_table(
            f"{prefix}_b", 2, access_threshold=0, eviction_threshold=150, num_shards=2
        ),
        npu_rec.create_table(f"{prefix}_c", 2, access_threshold=0, eviction_threshold=-1),
    ]
    lookups = []
    for t in tables:
        lookups.append(npu_rec.sparse_lookup(t, tf.constant([1, 2, 3], tf.int64), timestamps=100))
        lookups.append(npu_rec.sparse_lookup(t, tf.constant([3, 4], tf.int64), timestamps=200))
    ahead = tf.constant([2**62], tf.int64)
    lookups.append(npu_rec.sparse_lookup(tables[0], tf.constant([9], tf.int64), timestamps=ahead))
    return tables, lookups


@pytest.mark.parametrize("graph", [False, True])
def test_one_evictor_frees_what_each_tables_evict_frees(graph, caplog):
    from npu_rec.table._base import TableEvictor

    def run(prefix, together, sess=None):
        tables, lookups = _evictor_tables(prefix)
        if sess is not None:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(lookups)
        caplog.clear()
        with caplog.at_level("WARNING"):
            if together:
                freed = TableEvictor(tables)(now=260, session=sess)
            else:
                freed = {t.name: int(t.evict(now=260, session=sess)) for t in tables}
        states = [t.export(session=sess)["keys"].tolist() for t in tables]
        return list(freed.values()), states, caplog.text

    if graph:
        results = []
        for together in (False, True):
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                results.append(run(f"ev{together}", together, sess))
    else:
        results = [run(f"ev{together}", together) for together in (False, True)]
    (freed_each, keys_each, log_each), (freed_all, keys_all, log_all) = results
    # a: idle > 50 at 260 are the keys last seen at 100 and 200 (key 9 got the clock, 200);
    # b: idle > 150 are those seen at 100 only; c: eviction off.
    assert freed_all == freed_each == [5, 2, 0]
    assert keys_all == keys_each
    assert keys_all == [[], [3, 4], [1, 2, 3, 4]]
    assert "_a' replaced 1 training timestamps" in log_all
    assert "_a' replaced 1 training timestamps" in log_each
