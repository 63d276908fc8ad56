"""The minimal `tf.contrib` of the compat layer against TF 1.15's regularizer rules."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npu_rec.compat import _tf_contrib

WEIGHTS = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=1, max_dims=2, max_side=5),
    elements=st.floats(-4, 4, width=32),
)


@settings(max_examples=20, deadline=None)
@given(weights=WEIGHTS, scale=st.floats(0.001, 3.0))
def test_penalties_match_the_numpy_rule(weights, scale):
    l1 = _tf_contrib.l1_regularizer(scale)(tf.constant(weights))
    l2 = _tf_contrib.l2_regularizer(scale)(tf.constant(weights))
    both = _tf_contrib.l1_l2_regularizer(scale, 2 * scale)(tf.constant(weights))
    w = weights.astype(np.float64)
    np.testing.assert_allclose(l1.numpy(), scale * np.abs(w).sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l2.numpy(), scale * (w**2).sum() / 2, rtol=1e-5, atol=1e-5)
    expected = scale * np.abs(w).sum() + scale * (w**2).sum()
    np.testing.assert_allclose(both.numpy(), expected, rtol=1e-5, atol=1e-4)
    assert l1.dtype == tf.float32 and l1.shape == ()


def test_a_zero_scale_means_no_penalty_and_a_negative_one_is_refused():
    assert _tf_contrib.l1_regularizer(0.0)(tf.ones([2])) is None
    assert _tf_contrib.l1_l2_regularizer(0.0, 0.0)(tf.ones([2])) is None
    with pytest.raises(ValueError, match=r"`scale` must be a float >= 0. Received: scale=-1"):
        _tf_contrib.l2_regularizer(-1.0)
    with pytest.raises(TypeError, match=r"Received: scale_l1='x'"):
        _tf_contrib.l1_l2_regularizer("x")


def test_install_gives_tf_compat_v1_a_contrib_namespace_with_only_those_names():
    had = hasattr(tf.compat.v1, "contrib")
    try:
        _tf_contrib.install()
        contrib = tf.compat.v1.contrib
        _tf_contrib.install()  # idempotent: the same namespace
        assert tf.compat.v1.contrib is contrib
        assert contrib.layers.l1_regularizer is _tf_contrib.l1_regularizer
        with pytest.raises(AttributeError, match=r"tf.contrib.layers.xavier_initializer does not"):
            contrib.layers.xavier_initializer  # noqa: B018
        with pytest.raises(AttributeError, match=r"tf.contrib.slim does not exist"):
            contrib.slim  # noqa: B018
        assert not hasattr(tf, "contrib")  # TensorFlow 2's own namespace gets none
    finally:
        if not had:
            del tf.compat.v1.contrib


def test_a_v1_layer_takes_it_as_its_regularizer():
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable(
            "w",
            initializer=tf.constant([[1.0, -2.0], [3.0, -4.0]]),
            regularizer=_tf_contrib.l1_regularizer(0.5),
        )
        (penalty,) = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
        with tf.compat.v1.Session() as sess:
            sess.run(w.initializer)
            assert sess.run(penalty) == pytest.approx(5.0)
