"""`streaming_auc`: the Estimator's (value, update_op) AUC, checked against NumPy."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_rec import estimator as E
from npu_rec.estimator._auc import auc_thresholds
from tests.helpers import auc as exact_auc


def _reference(labels, preds, num_thresholds, weights=None):
    """ROC AUC at the thresholds, trapezoidal, in NumPy (keras.metrics.AUC's definition)."""
    w = np.ones(len(preds)) if weights is None else np.asarray(weights, np.float64)
    t = np.asarray(auc_thresholds(num_thresholds), np.float32)
    above = preds.astype(np.float32)[:, None] > t[None, :]
    pos = labels.astype(bool)
    tp = (w[:, None] * (above & pos[:, None])).sum(0)
    fp = (w[:, None] * (above & ~pos[:, None])).sum(0)
    fn, tn = (w * pos).sum() - tp, (w * ~pos).sum() - fp
    tpr = np.divide(tp, tp + fn, out=np.zeros_like(tp), where=(tp + fn) > 0)
    fpr = np.divide(fp, fp + tn, out=np.zeros_like(fp), where=(fp + tn) > 0)
    return float(np.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2))


def _streamed(batches, num_thresholds=200, weighted=False):
    with tf.Graph().as_default():
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        preds = tf.compat.v1.placeholder(tf.float32, [None])
        weights = tf.compat.v1.placeholder(tf.float32, [None]) if weighted else None
        value, update = E.streaming_auc(
            labels, preds, weights=weights, num_thresholds=num_thresholds
        )
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            assert sess.run(value) == 0.0
            for batch in batches:
                feed = {labels: batch[0], preds: batch[1]}
                if weighted:
                    feed[weights] = batch[2]
                sess.run(update, feed)
            return float(sess.run(value))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    num_thresholds=st.sampled_from([2, 3, 17, 200]),
)
def test_streamed_batches_match_the_numpy_reference_on_all_rows(seed, sizes, num_thresholds):
    rng = np.random.default_rng(seed)
    batches = [
        (
            rng.integers(0, 2, n).astype(np.float32),
            rng.choice([0.0, 1.0, 0.5, rng.random()], n)
            if n % 3 == 0
            else rng.random(n).astype(np.float32),
        )
        for n in sizes
    ]
    labels = np.concatenate([b[0] for b in batches])
    preds = np.concatenate([b[1] for b in batches])
    want = _reference(labels, preds, num_thresholds)
    assert _streamed(batches, num_thresholds) == pytest.approx(want, abs=1e-5)


def test_weights_count_rows_that_many_times(rng):
    labels = rng.integers(0, 2, 300).astype(np.float32)
    preds = rng.random(300).astype(np.float32)
    weights = rng.integers(0, 4, 300).astype(np.float32)
    got = _streamed([(labels, preds, weights)], weighted=True)
    assert got == pytest.approx(_reference(labels, preds, 200, weights), abs=1e-5)
    repeated = np.repeat(np.arange(300), weights.astype(int))
    assert got == pytest.approx(_streamed([(labels[repeated], preds[repeated])]), abs=1e-5)


def test_close_to_the_exact_rank_auc_and_equal_to_keras_auc(rng):
    labels = rng.integers(0, 2, 4000).astype(np.float32)
    preds = np.clip(0.5 * labels + rng.normal(0.25, 0.3, 4000), 0, 1).astype(np.float32)
    got = _streamed([(labels[:2500], preds[:2500]), (labels[2500:], preds[2500:])])
    assert got == pytest.approx(exact_auc(labels, preds), abs=5e-3)
    metric = keras.metrics.AUC(num_thresholds=200)
    metric.update_state(labels, preds)
    assert got == pytest.approx(float(metric.result()), abs=1e-5)


@pytest.mark.parametrize("bad", [1, 0, 2.5, True])
def test_num_thresholds_is_validated(bad):
    with tf.Graph().as_default():
        with pytest.raises(
            ValueError,
            match=rf"`num_thresholds` must be an integer >= 2\. "
            rf"Received: num_thresholds={bad!r}",
        ):
            E.streaming_auc(tf.constant([1.0]), tf.constant([0.5]), num_thresholds=bad)


def test_eager_use_points_to_keras_auc():
    with pytest.raises(RuntimeError, match="keras.metrics.AUC"):
        E.streaming_auc(tf.constant([1.0]), tf.constant([0.5]))
