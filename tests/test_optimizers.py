"""Sparse optimizers: numerics against the NumPy reference, laziness, validation, aliases."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_rec
from npu_rec import optimizers
from tests.table.table_helpers import OPTIMIZERS, assert_same_state
from tests.table.table_reference import ReferenceTable, RefOptimizer


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_random_steps_match_reference(name):
    make_opt, make_ref = OPTIMIZERS[name]
    table = npu_rec.create_table(f"o_{name}", 5, optimizer=make_opt())
    ref = ReferenceTable(f"o_{name}", 5, make_ref())
    rng = np.random.default_rng(3)
    for _ in range(6):
        ids = rng.integers(0, 12, size=20)
        grads = rng.normal(size=(20, 5)).astype(np.float32)
        npu_rec.sparse_lookup(table, tf.constant(ids), timestamps=1)
        table.apply_gradients(tf.constant(ids), tf.constant(grads))
        ref.lookup(ids, [1] * 20)
        ref.apply(ids, grads)
    assert_same_state(table, ref)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_only_rows_in_the_batch_move(name):
    table = npu_rec.create_table(f"lazy_{name}", 2, optimizer=OPTIMIZERS[name][0]())
    npu_rec.sparse_lookup(table, tf.constant([1, 2, 3], tf.int64))
    before = table.export()
    table.apply_gradients(tf.constant([2], tf.int64), tf.ones([1, 2]))
    after = table.export()
    np.testing.assert_array_equal(after["values"][[0, 2]], before["values"][[0, 2]])
    assert not np.allclose(after["values"][1], before["values"][1])
    for slot in after["slots"]:
        np.testing.assert_array_equal(after["slots"][slot][[0, 2]], before["slots"][slot][[0, 2]])


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    dim=st.integers(1, 9),
    lr=st.floats(0.001, 1.0),
    init=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    kernels=st.booleans(),
)
def test_rowwise_adagrad_matches_reference(dim, lr, init, seed, kernels):
    """One accumulator per row: acc += mean(g*g); row -= lr * g / (sqrt(acc) + eps)."""
    from npu_rec._kernels import _build
    from npu_rec.table import _registry as _table_registry

    _table_registry.clear()
    with _build.forced(kernels):
        table = npu_rec.create_table(
            "rw", dim, optimizer=optimizers.RowWiseAdagrad(lr, initial_accumulator_value=init)
        )
    ref = ReferenceTable(
        "rw",
        dim,
        RefOptimizer(
            "rowwise_adagrad", learning_rate=lr, initial_accumulator_value=init, epsilon=1e-7
        ),
    )
    rng = np.random.default_rng(seed)
    for _ in range(4):
        ids = rng.integers(0, 10, size=12)
        grads = rng.normal(size=(12, dim)).astype(np.float32)
        npu_rec.sparse_lookup(table, tf.constant(ids), timestamps=1)
        table.apply_gradients(tf.constant(ids), tf.constant(grads))
        ref.lookup(ids, [1] * 12)
        ref.apply(ids, grads)
    assert_same_state(table, ref, atol=1e-6)
    assert table.export()["slots"]["accumulator"].shape == (len(ref.rows), 1)


def test_rowwise_adagrad_keeps_one_accumulator_per_row():
    opt = optimizers.RowWiseAdagrad(0.05)
    assert opt.get_config() == {
        "learning_rate": 0.05,
        "name": "RowWiseAdagrad",
        "initial_accumulator_value": 0.1,
        "epsilon": 1e-7,
    }
    table = npu_rec.create_table("rw_slot", 16, optimizer=opt)
    assert table.storage.slots["accumulator"].shape[1] == 1
    late = npu_rec.create_table("rw_late", 16)
    npu_rec.sparse_lookup(late, tf.constant([1, 2], tf.int64))
    late.bind_optimizer(optimizers.RowWiseAdagrad(0.05, initial_accumulator_value=0.3))
    late.apply_gradients(tf.constant([2], tf.int64), tf.ones([1, 16]))
    acc = late.export()["slots"]["accumulator"]
    np.testing.assert_allclose(acc, [[0.3], [1.3]])


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: optimizers.SGD(learning_rate=0), "`learning_rate` must be a number > 0.0"),
        (lambda: optimizers.Adagrad(epsilon=-1), "`epsilon`"),
        (
            lambda: optimizers.RowWiseAdagrad(0.1, initial_accumulator_value=-1),
            "`initial_accumulator_value`",
        ),
        (lambda: optimizers.Adam(beta_1=1.0), "`beta_1` must be a number >= 0.0 and < 1.0"),
        (lambda: optimizers.Ftrl(learning_rate_power=0.5), "`learning_rate_power`"),
        (lambda: optimizers.Ftrl(l1=True), "`l1`"),
    ],
)
def test_hyperparameter_validation(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_rec_sdk_aliases():
    assert optimizers.SGDByAddr is optimizers.SGD
    assert optimizers.LazyAdamByAddress is optimizers.Adam
    opt = optimizers.create_hash_optimizer(learning_rate=0.01, beta1=0.8)
    assert isinstance(opt, optimizers.Adam) and opt.beta_1 == 0.8
    assert isinstance(optimizers.create_hash_optimizer_by_address(0.01), optimizers.Adam)
    assert optimizers.Adagrad(0.1).get_config()["initial_accumulator_value"] == 0.1


def _decay():
    import keras

    return keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=2, decay_rate=0.5)


def _decay_reference(k):
    return 0.2 * 0.5 ** (k / 2)  # ExponentialDecay at k updates done


_SCHEDULED = {
    "sgd": lambda lr: npu_rec.optimizers.SGD(lr),
    "adagrad": lambda lr: npu_rec.optimizers.Adagrad(lr),
    "adam": lambda lr: npu_rec.optimizers.Adam(lr),
    "ftrl": lambda lr: npu_rec.optimizers.Ftrl(lr, l1=0.001, l2=0.01),
}


def _scheduled_run(name, schedule, mode):
    """Six random updates of a table whose optimizer follows `schedule`, in `mode`."""
    table = npu_rec.create_table(f"s_{name}_{mode}", 5, optimizer=_SCHEDULED[name](schedule))
    ref = ReferenceTable(f"s_{name}_{mode}", 5, OPTIMIZERS[name][1]())
    rng = np.random.default_rng(5)
    batches = [
        (rng.integers(0, 12, size=20), rng.normal(size=(20, 5)).astype(np.float32))
        for _ in range(6)
    ]

    def step(ids, grads):
        npu_rec.sparse_lookup(table, ids, timestamps=1)
        table.apply_gradients(ids, grads)

    if mode == "function":
        step = tf.function(step)
    for k, (ids, grads) in enumerate(batches):
        step(tf.constant(ids), tf.constant(grads))
        ref.lookup(ids, [1] * 20)
        ref.opt.hp["learning_rate"] = _decay_reference(k)
        ref.apply(ids, grads)
    return table, ref


@pytest.mark.parametrize("name", sorted(_SCHEDULED))
def test_a_keras_schedule_drives_the_table_learning_rate(name):
    table, ref = _scheduled_run(name, _decay(), "eager")
    assert_same_state(table, ref)


def test_a_callable_schedule_in_a_tf_function():
    table, ref = _scheduled_run(
        "adagrad", lambda step: 0.2 * 0.5 ** (tf.cast(step, tf.float32) / 2), "function"
    )
    assert_same_state(table, ref)


def test_a_schedule_in_a_v1_graph_as_the_estimator_runs_it():
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 8, size=(4, 10))
    grads = rng.normal(size=(4, 10, 3)).astype(np.float32)
    with tf.Graph().as_default():
        table = npu_rec.create_table("s_graph", 3, optimizer=npu_rec.optimizers.SGD(_decay()))
        ph_ids, ph_grads = tf.compat.v1.placeholder(tf.int64), tf.compat.v1.placeholder(tf.float32)
        lookup = npu_rec.sparse_lookup(table, ph_ids, timestamps=1)
        with tf.control_dependencies([lookup]):
            train = table.apply_gradients(ph_ids, ph_grads)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first, checked = None, 0
            for k in range(4):
                before = table.export(session=sess)
                sess.run(train, {ph_ids: ids[k], ph_grads: grads[k]})
                after = table.export(session=sess)
                if first is None:
                    first = after
                    continue
                # Every key of this step was live before: row -= lr_k * summed grad.
                summed = {int(i): grads[k][ids[k] == i].sum(0) for i in np.unique(ids[k])}
                old = dict(zip(before["keys"].tolist(), before["values"], strict=True))
                for key, row in zip(after["keys"].tolist(), after["values"], strict=True):
                    if key in summed and key in old:
                        np.testing.assert_allclose(
                            row, old[key] - _decay_reference(k) * summed[key], atol=1e-6
                        )
                        checked += 1
    assert checked > 10


def test_learning_rate_schedules_serialise_and_plain_callables_say_they_cannot():
    opt = npu_rec.optimizers.Adam(_decay())
    clone = npu_rec.optimizers.Adam(**opt.get_config())
    assert clone.learning_rate.get_config() == _decay().get_config()
    assert float(clone.learning_rate_at(tf.constant(3, tf.int64))) == pytest.approx(
        _decay_reference(2)
    )
    with pytest.raises(ValueError, match="cannot serialise its learning_rate"):
        npu_rec.optimizers.SGD(lambda step: 0.1).get_config()
    with pytest.raises(
        ValueError,
        match="`learning_rate` must be a number > 0.0, a float scalar tf.Tensor, a keras",
    ):
        npu_rec.optimizers.SGD("fast")
