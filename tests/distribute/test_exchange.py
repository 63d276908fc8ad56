"""A route's buffers carry every bit of what they are given (one worker, collectives as copies)."""

import numpy as np
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_rec.distribute._exchange import Route


class _OneWorker:
    """The collectives of a group of one worker: every message comes back to it."""

    num_workers, rank = 1, 0

    def gather_sizes(self, counts, site):
        return counts[None, :]

    def all_to_all(self, buffer, site, bucket):
        return tf.identity(buffer)


@settings(max_examples=25, deadline=None)
@given(
    ids=st.lists(st.integers(-1, 2**40), min_size=1, max_size=20),
    width=st.integers(0, 3),
    seed=st.integers(0, 2**31 - 1),
)
def test_packed_row_ids_and_denormals_go_and_come_back_bit_exact(ids, width, seed):
    # Row ids bit-cast into float32 columns are denormals (a CPU adding them would flush
    # them to zero): sent and replied, every bit must survive.
    extra = np.random.default_rng(seed).standard_normal((len(ids), width)).astype(np.float32)
    values = tf.concat(
        [tf.bitcast(tf.constant(ids, tf.int64), tf.float32), tf.constant(extra * 1e-39)], 1
    )

    @tf.function
    def trip(values):
        route = Route(_OneWorker(), tf.zeros([tf.shape(values)[0]], tf.int32))
        received = route.send(values)
        return received, route.reply(received)

    received, replied = trip(values)
    for got in (received, replied):
        np.testing.assert_array_equal(got.numpy().view(np.int32), values.numpy().view(np.int32))
        np.testing.assert_array_equal(tf.bitcast(got[:, :2], tf.int64).numpy(), ids)
