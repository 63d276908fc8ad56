"""The Estimator on the fixed-shape data path: sparse multi-valued ids train like ragged ones."""

import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.data import ParquetSource, as_input_fn
from tests.keras.test_fixed_shapes import BATCH, PAD_LENGTH, _parquet

SEEN = []


def _model_fn(features, labels, mode):
    tags = features["tags"]
    SEEN.append(type(tags))
    table = npu_rec.create_table("tags", 4, optimizer=npu_rec.optimizers.Adagrad(0.1))
    emb = npu_rec.sparse_lookup(
        table, tags, combiner="mean", is_training=mode == E.ModeKeys.TRAIN
    )  # [batch, 4]
    w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
    logits = tf.reshape(tf.matmul(emb, w), [-1])
    loss = tf.reduce_mean(
        tf.compat.v1.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    step = tf.compat.v1.train.get_global_step()
    train_op = E.sparse_train_op(loss, tf.compat.v1.train.GradientDescentOptimizer(0.5), step)
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(path: str, model_dir, static: bool):
    npu_rec.shutdown()
    SEEN.clear()
    est = E.NPUEstimator(
        _model_fn, config=E.NPURunConfig(model_dir=str(model_dir), save_checkpoints_steps=100)
    )
    input_fn = as_input_fn(
        ParquetSource(path, label="click", multi_valued=["tags"]),
        BATCH,
        num_sweeps=2,
        use_dynamic=not static,
        pad_length=PAD_LENGTH,
    )
    est.train(input_fn)
    return est, SEEN[0], _saved_table(model_dir)


def _saved_table(model_dir) -> dict:
    """The newest saved state of table "tags" in `model_dir`, as `export()` gives it."""
    npu_rec.shutdown()
    with tf.Graph().as_default():
        table = npu_rec.create_table("tags", 4, optimizer=npu_rec.optimizers.Adagrad(0.1))
        manager = TableCheckpointManager(str(model_dir / "tables"), [table])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            manager.restore(session=sess)
            return table.export(session=sess)


def test_estimator_trains_on_fixed_shapes_like_on_ragged_ids(tmp_path):
    path = _parquet(tmp_path / "tags.parquet")
    static, static_type, static_tables = _train(path, tmp_path / "static", static=True)
    ragged, ragged_type, ragged_tables = _train(path, tmp_path / "ragged", static=False)
    assert static_type is tf.SparseTensor and ragged_type is tf.RaggedTensor
    assert static.latest_checkpoint() and ragged.latest_checkpoint()
    assert -1 in static_tables["keys"].tolist()  # a raw id, trained like the others
    assert static_tables["keys"].tolist() == ragged_tables["keys"].tolist()
    np.testing.assert_allclose(
        static_tables["values"], ragged_tables["values"], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        tf.train.load_variable(static.latest_checkpoint(), "w"),
        tf.train.load_variable(ragged.latest_checkpoint(), "w"),
        rtol=1e-5,
    )
