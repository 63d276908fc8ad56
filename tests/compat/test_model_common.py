"""mx_rec.util.model_common: the Rec SDK samples' Config, schedule, pipeline and evaluation."""

import importlib
import logging

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_rec.compat.mx_rec.util import model_common as cm


@pytest.fixture
def sample(monkeypatch, tmp_path):
    """DLRM's settings scaled down: 2-sample records, batches of 4 samples, dim 4."""
    for name, value in {
        "TRAIN_RANK_SIZE": "1",
        "CACHE_MODE": "HBM",
        "BATCH_SIZE": "4",
        "LINE_PER_SAMPLE": "2",
        "EMB_DIM": "4",
        "DEV_VOCAB_SIZE": "64",
        "DLRM_CRITEO_DATA_PATH": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cm, "MODEL_NAME", "DLRM")
    monkeypatch.setattr(cm, "eval_steps", 0)
    return tmp_path


def _write_records(folder, rows, labels=1, sparse=26, dense=13, lines=2):
    """`rows` records of `lines` samples; sample k has label k % 2 and ids k*100 + column."""
    folder.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(folder / "part-0.tfrecord")) as writer:
        for r in range(rows):
            samples = range(r * lines, (r + 1) * lines)
            feature = {
                "label": [s % 2 for s in samples for _ in range(labels)],
                "sparse_feature": [s * 100 + c for s in samples for c in range(sparse)],
            }
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        **{
                            k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
                            for k, v in feature.items()
                        },
                        "dense_feature": tf.train.Feature(
                            float_list=tf.train.FloatList(
                                value=[float(s) for s in samples for _ in range(dense)]
                            )
                        ),
                    }
                )
            )
            writer.write(ex.SerializeToString())


def _reference_factor(step, warmup, start, steps):
    if step < warmup:
        return step / warmup
    if step < start:
        return 1.0
    if step < start + steps:
        return ((start + steps - step) / steps) ** 2
    return 1.0 / steps


@settings(max_examples=25, deadline=None)
@given(
    step=st.integers(0, 400),
    warmup=st.integers(1, 100),
    start=st.integers(100, 200),
    steps=st.integers(1, 150),
)
def test_schedule_is_warm_up_constant_then_square_decay(step, warmup, start, steps):
    rates = cm.LearningRateScheduler(2.0, 30.0, warmup, start, steps)
    before, cm.MODEL_NAME = cm.MODEL_NAME, "DLRM"
    try:
        dense, sparse = (t.numpy() for t in rates.calc(tf.constant(step)))
    finally:
        cm.MODEL_NAME = before
    factor = _reference_factor(step, warmup, start, steps)
    np.testing.assert_allclose(dense, 2.0 * factor, rtol=1e-5, atol=1e-6)
    # DLRM's and DCNv2's sparse rate is clamped to [0, 10].
    np.testing.assert_allclose(sparse, min(30.0 * factor, 10.0), rtol=1e-5, atol=1e-6)


def test_config_holds_the_sample_settings_and_the_scaled_sizes(sample, monkeypatch):
    with tf.Graph().as_default():
        cfg = cm.Config()
    assert (cfg.batch_size, cfg.line_per_sample, cfg.emb_dim) == (4, 2, 4)
    assert cfg.key_type == tf.int64 and cfg.send_count == 46000 and cfg.rank_size == 1
    assert cfg.get_emb_table_cfg() == {"device_vocabulary_size": 64}
    assert len(cfg.learning_rate) == 2 and cfg.use_lazy_adam_optimizer is False
    monkeypatch.delenv("DEV_VOCAB_SIZE")
    monkeypatch.setenv("CACHE_MODE", "DDR")
    with tf.Graph().as_default():
        assert cm.Config().get_emb_table_cfg() == {
            "device_vocabulary_size": 500_000,
            "host_vocabulary_size": 24_000_000,
        }
    monkeypatch.setenv("CACHE_MODE", "SSD")
    with tf.Graph().as_default():
        table_cfg = cm.Config().get_emb_table_cfg()
    assert table_cfg["ssd_vocabulary_size"] == 24_000_000 and table_cfg["ssd_data_path"]


@pytest.mark.parametrize(
    ("env", "model", "message"),
    [
        ({"CACHE_MODE": "HBMX"}, "DLRM", "CACHE_MODE as one of HBM, DDR, SSD. Received: "),
        ({"TRAIN_RANK_SIZE": ""}, "DLRM", "please export TRAIN_RANK_SIZE"),
        ({}, "WideDeep", "Received: MODEL_NAME='WideDeep'"),
        ({}, "MMOE", "its own config.py"),
    ],
)
def test_config_refuses_what_it_cannot_size(sample, monkeypatch, env, model, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cm, "MODEL_NAME", model)
    with tf.Graph().as_default(), pytest.raises(ValueError, match=message):
        cm.Config()


def test_module_flags_are_read_from_the_environment(monkeypatch):
    try:
        monkeypatch.setenv("USE_MULTI_LOOKUP", "1")
        monkeypatch.setenv("INTERVAL", "5")
        importlib.reload(cm)
        assert cm.use_multi_lookup is True and cm.interval == 5 and cm.use_faae is False
        monkeypatch.setenv("USE_FAAE", "2")
        with pytest.raises(ValueError, match=r"USE_FAAE must be 0 or 1. Received: USE_FAAE='2'"):
            importlib.reload(cm)
    finally:
        monkeypatch.undo()
        importlib.reload(cm)


def test_feature_specs_of_the_sparse_column(sample):
    cfg = type("Cfg", (), {"batch_size": 8})()
    (one,) = cm.create_feature_spec_list(cfg, use_timestamp=False)
    assert (one.name, one.table_name, one.batch_size, one.access_threshold) == (
        "sparse_feature",
        "sparse_embeddings",
        8,
        None,
    )
    specs = cm.create_feature_spec_list(cfg, True, use_timestamp=True)
    assert [s.name for s in specs] == ["sparse_feature", "sparse_feature", "timestamp"]
    assert (specs[0].access_threshold, specs[0].eviction_threshold) == (1000, 180)
    assert specs[2].is_timestamp


def test_pipeline_reads_records_into_sample_rows(sample):
    _write_records(sample / "train", rows=6)
    _write_records(sample / "test", rows=3)
    with tf.Graph().as_default():
        cfg = cm.Config()
        cfg.train_epoch = 1
        batch, it = cm.make_batch_and_iterator(cfg, [], is_training=False, dump_graph=False)
        train, train_it = cm.make_batch_and_iterator(
            cfg, [], is_training=True, dump_graph=True, is_use_faae=True
        )
        with tf.compat.v1.Session() as sess:
            sess.run([it.initializer, train_it.initializer])
            first = sess.run(batch)
            seen = []
            while True:
                try:
                    seen.append(sess.run(train))
                except tf.errors.OutOfRangeError:
                    break
    assert first["label"].shape == (4, 1) and first["dense_feature"].shape == (4, 13)
    np.testing.assert_array_equal(first["label"][:, 0], [0, 1, 0, 1])
    np.testing.assert_array_equal(first["sparse_feature"][1], 100 + np.arange(26))
    np.testing.assert_array_equal(first["dense_feature"][3], np.full(13, 3.0))
    # 6 records of 2 samples, 2 records per batch: 3 batches, every sample once.
    assert len(seen) == 3 and seen[0]["timestamp"].shape == (4, 1)
    ids = sorted(int(b["sparse_feature"][i, 0]) // 100 for b in seen for i in range(4))
    assert ids == list(range(12))


def test_pipeline_reads_mmoe_records(sample, monkeypatch):
    _write_records(sample / "test", rows=2, labels=2, sparse=29, dense=11)
    monkeypatch.setattr(cm, "MODEL_NAME", "MMOE")
    cfg = type(
        "Cfg",
        (),
        dict(batch_size=4, line_per_sample=2, data_path=str(sample), test_file_pattern="test"),
    )()
    cfg.test_epoch = 1
    with tf.Graph().as_default():
        batch, it = cm.make_batch_and_iterator(cfg, [], is_training=False, dump_graph=False)
        with tf.compat.v1.Session() as sess:
            sess.run(it.initializer)
            out = sess.run(batch)
    assert out["label"].shape == (4, 2) and out["sparse_feature"].shape == (4, 29)
    assert out["dense_feature"].shape == (4, 11)


def test_pipeline_without_files_names_the_pattern(sample):
    with tf.Graph().as_default(), pytest.raises(ValueError, match=r"No TFRecord file matches"):
        cm.make_batch_and_iterator(cm.Config(), [], is_training=True, dump_graph=False)


def _pairwise_auc(labels, scores):
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=30, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.booleans(), st.sampled_from([0.1, 0.2, 0.5, 0.7, 0.9])),
        min_size=2,
        max_size=30,
    )
)
def test_auc_is_the_pairwise_rank_statistic(data):
    labels, scores = zip(*data, strict=True)
    if len(set(labels)) < 2:
        with pytest.raises(ValueError, match="labels of both classes"):
            cm._auc(labels, scores)
        return
    assert cm._auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores))


def _eval_model():
    labels = np.array([1, 0, 1, 0, 0, 1], np.float32)
    preds = np.array([0.9, 0.2, 0.6, 0.7, 0.1, 0.8], np.float32)
    ds = tf.data.Dataset.from_tensor_slices((labels, preds)).batch(2)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    label, pred = it.get_next()
    loss = -(label * tf.math.log(pred) + (1 - label) * tf.math.log(1 - pred))
    return {"loss": loss, "pred": pred, "label": label}, it, labels, preds


def test_evaluate_runs_the_input_to_its_end_or_eval_steps(sample, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with tf.Graph().as_default():
        model, it, labels, preds = _eval_model()
        with tf.compat.v1.Session() as sess:
            auc, loss = cm.evaluate(sess, model, it, None)
            again = cm.evaluate(logging.getLogger("x"), sess, model, it, None)  # older form
            monkeypatch.setattr(cm, "eval_steps", 1)
            monkeypatch.setattr(cm, "interval", 3)
            fix_auc, _ = cm.evaluate_fix(20, sess, model, it)
    expected = -(labels * np.log(preds) + (1 - labels) * np.log(1 - preds)).mean()
    assert auc == pytest.approx(_pairwise_auc(labels, preds)) and again[0] == auc
    assert loss == pytest.approx(expected, rel=1e-5)
    assert fix_auc == 1.0  # the first batch only: (0.9, 1) and (0.2, 0)
    saved = tmp_path / "interval_3" / "numpy_20"
    np.testing.assert_array_equal(np.load(saved / "label_0.npy"), [1, 0])
    np.testing.assert_allclose(np.load(saved / "pred_0.npy"), [0.9, 0.2])
    with pytest.raises(TypeError, match="expected 4 arguments"):
        cm.evaluate(1, 2)


def test_session_settings_for_a_cpu():
    config = cm.sess_config(dump_data=True)
    assert isinstance(config, tf.compat.v1.ConfigProto) and config.allow_soft_placement
    assert not config.graph_options.rewrite_options.custom_optimizers
    run = cm.get_npu_run_config()
    assert (run.save_checkpoints_steps, run.keep_checkpoint_max) == (100, 5)
    cm.clear_saved_model()  # nothing to clear, no error
