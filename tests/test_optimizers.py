"""Sparse optimizers: numerics against the NumPy reference, laziness, validation, aliases."""

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import optimizers
from tests.table_helpers import OPTIMIZERS, assert_same_state
from tests.table_reference import ReferenceTable


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
        np.testing.assert_array_equal(after["slots"][slot][[0, 2]],
                                      before["slots"][slot][[0, 2]])


@pytest.mark.parametrize("factory, match", [
    (lambda: optimizers.SGD(learning_rate=0), "`learning_rate` must be a number > 0.0"),
    (lambda: optimizers.Adagrad(epsilon=-1), "`epsilon`"),
    (lambda: optimizers.Adam(beta_1=1.0), "`beta_1` must be a number >= 0.0 and < 1.0"),
    (lambda: optimizers.Ftrl(learning_rate_power=0.5), "`learning_rate_power`"),
    (lambda: optimizers.Ftrl(l1=True), "`l1`"),
])
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
