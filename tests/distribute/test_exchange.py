"""The exchange's buffers carry every bit of what they are given."""

import numpy as np
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_rec.distribute._exchange import _place


@settings(max_examples=25, deadline=None)
@given(
    ids=st.lists(st.integers(-1, 2**40), min_size=1, max_size=20),
    width=st.integers(0, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_packed_row_ids_and_denormals_come_through_bit_exact(ids, width, seed):
    # Row ids bit-cast into float32 columns are denormals: placing them must keep their bits.
    rng = np.random.default_rng(seed)
    n = len(ids)
    rows = tf.bitcast(tf.constant(ids, tf.int64), tf.float32)  # [n, 2]
    extra = rng.standard_normal((n, width)).astype(np.float32) * np.float32(1e-39)
    values = tf.concat([rows, tf.constant(extra)], 1)
    size = n + 3
    slots = rng.permutation(size)[:n].astype(np.int32)

    placed = tf.function(_place)(tf.constant(slots), values, tf.constant([size, 2 + width]))

    want = np.zeros((size, 2 + width), np.float32)
    want[slots] = values.numpy()
    np.testing.assert_array_equal(placed.numpy().view(np.int32), want.view(np.int32))
    back = tf.bitcast(tf.gather(placed, slots)[:, :2], tf.int64).numpy()
    np.testing.assert_array_equal(back, ids)


def test_integer_and_bfloat16_buffers_keep_their_values():
    slots = tf.constant([2, 0], tf.int32)
    ints = _place(slots, tf.constant([[7], [-1]], tf.int64), tf.constant([3, 1]))
    np.testing.assert_array_equal(ints.numpy(), [[-1], [0], [7]])
    halves = _place(slots, tf.constant([[1.5], [-2.0]], tf.bfloat16), tf.constant([3, 1]))
    assert halves.dtype == tf.bfloat16
    np.testing.assert_array_equal(halves.numpy().astype(np.float32), [[-2.0], [0.0], [1.5]])
