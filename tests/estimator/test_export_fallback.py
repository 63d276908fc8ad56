"""An Estimator with `not_admitted="hashed"` tables: the fallback rows are checkpointed with the
tables and the exported SavedModel serves ids without a row from them (stock ops)."""

import numpy as np
import tensorflow as tf

from npu_rec import estimator as E
from npu_rec.estimator import export
from tests.estimator import models


def test_exported_savedmodel_serves_unknown_ids_from_the_trained_fallback(tmp_path):
    params = {
        "export_outputs": True,
        "access_threshold": 3,
        "table_kwargs": {"not_admitted": "hashed", "fallback_buckets": 64},
    }
    est = E.NPUEstimator(
        models.deepfm_model_fn,
        model_dir=str(tmp_path / "model"),
        params=params,
        config=E.NPURunConfig(log_step_count_steps=None, random_seed=1),
    )
    est.train(models.synthetic_input_fn(0, 640), max_steps=10)
    features, labels = models.synthetic_arrays(640, 704)
    features["cat"][::2] += 10**9  # half the rows: ids never seen, read from the fallback
    input_fn = models.make_input_fn(features, labels)
    expected = np.array([p["probabilities"] for p in est.predict(input_fn)])
    with_zeros = E.NPUEstimator(
        models.deepfm_model_fn,
        model_dir=str(tmp_path / "model"),
        params={**params, "table_kwargs": {}},
        config=E.NPURunConfig(log_step_count_steps=None, random_seed=1),
    )
    zeros = np.array([p["probabilities"] for p in with_zeros.predict(input_fn)])
    assert np.abs(expected[::2] - zeros[::2]).max() > 1e-4  # the fallback rows matter
    spec = {
        "cat": tf.io.FixedLenFeature([models.NUM_CAT], tf.int64),
        "dense": tf.io.FixedLenFeature([models.NUM_DENSE], tf.float32),
    }
    path = est.export_saved_model(
        str(tmp_path / "export"), export.build_parsing_serving_input_receiver_fn(spec)
    )
    served = tf.saved_model.load(path.decode())
    examples = tf.constant(_examples(features))
    out = served.signatures["serving_default"](examples=examples)["probabilities"].numpy()
    np.testing.assert_allclose(out, expected, atol=1e-6)


def _examples(features: dict) -> list[bytes]:
    rows = []
    for i in range(len(features["cat"])):
        feature = {
            "cat": tf.train.Feature(int64_list=tf.train.Int64List(value=features["cat"][i])),
            "dense": tf.train.Feature(float_list=tf.train.FloatList(value=features["dense"][i])),
        }
        rows.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    return rows
