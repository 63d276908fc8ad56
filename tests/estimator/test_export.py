"""`npu_rec.estimator.export`: export outputs and receivers as tf.estimator.export.

The model_fns are written as public tf.estimator ones are (tensorflow/models'
iris custom estimator with feature columns, official/mnist's `export_outputs`,
a DeepFM estimator with a `tf.Example` parsing receiver); only the imports
differ (and Keras 3 layers stand for `tf.layers`, see docs/porting.md).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_rec import estimator as E
from npu_rec.estimator import export
from tests.estimator import models

IRIS_FEATURES = ["SepalLength", "SepalWidth", "PetalLength", "PetalWidth"]


def iris_model_fn(features, labels, mode, params):
    """tensorflow/models samples/core/get_started/custom_estimator.py, with export outputs."""
    net = tf.compat.v1.feature_column.input_layer(features, params["feature_columns"])
    for units in params["hidden_units"]:
        net = keras.layers.Dense(units, activation="relu")(net)
    logits = keras.layers.Dense(params["n_classes"])(net)
    predicted_classes = tf.argmax(logits, 1)
    if mode == E.ModeKeys.PREDICT:
        predictions = {
            "class_ids": predicted_classes[:, tf.newaxis],
            "probabilities": tf.nn.softmax(logits),
            "logits": logits,
        }
        return E.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={
                "serving_default": export.ClassificationOutput(
                    scores=predictions["probabilities"],
                    classes=tf.as_string(tf.range(params["n_classes"]))[tf.newaxis]
                    + tf.zeros_like(logits, tf.string),
                ),
                "predict": export.PredictOutput(predictions),
            },
        )
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    accuracy = tf.compat.v1.metrics.accuracy(
        labels=labels, predictions=predicted_classes, name="acc_op"
    )
    tf.compat.v1.summary.scalar("accuracy", accuracy[1])
    if mode == E.ModeKeys.EVAL:
        return E.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
    optimizer = tf.compat.v1.train.AdagradOptimizer(learning_rate=0.1)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _iris(n=120, seed=0):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 3, n)
    centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
    x = (centers[labels] + rng.normal(0, 0.3, (n, 4))).astype(np.float32)
    return {k: x[:, i] for i, k in enumerate(IRIS_FEATURES)}, labels.astype(np.int64)


def _iris_input_fn(epochs=1, batch=20):
    features, labels = _iris()

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((features, labels)).repeat(epochs).batch(batch)

    return input_fn


def _examples(features: dict) -> list[bytes]:
    rows = []
    n = len(next(iter(features.values())))
    for i in range(n):
        feature = {}
        for k, v in features.items():
            row = np.atleast_1d(v[i])
            if row.dtype.kind == "f":
                feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=row))
            else:
                feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=row))
        rows.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    return rows


def test_iris_classification_and_predict_signatures(tmp_path):
    columns = [tf.compat.v1.feature_column.numeric_column(k) for k in IRIS_FEATURES]
    est = E.Estimator(
        iris_model_fn,
        model_dir=str(tmp_path / "model"),
        params={"feature_columns": columns, "hidden_units": [10, 10], "n_classes": 3},
        config=E.RunConfig(log_step_count_steps=None, random_seed=0),
    )
    est.train(_iris_input_fn(epochs=30), steps=150)
    # It learned (chance is 1/3); 150 steps from some initialisations reach only ~0.78.
    assert est.evaluate(_iris_input_fn())["accuracy"] > 0.6
    spec = tf.compat.v1.feature_column.make_parse_example_spec(columns)
    path = est.export_saved_model(
        str(tmp_path / "export"), export.build_parsing_serving_input_receiver_fn(spec)
    )
    features, _ = _iris()
    expected = [p["probabilities"] for p in est.predict(_iris_input_fn())]
    served = tf.saved_model.load(path.decode())
    assert set(served.signatures) == {"serving_default", "predict"}
    examples = tf.constant(_examples(features))
    classify = served.signatures["serving_default"](inputs=examples)
    np.testing.assert_allclose(classify["scores"].numpy(), expected, atol=1e-5)
    assert classify["classes"].numpy()[0].tolist() == [b"0", b"1", b"2"]
    predict = served.signatures["predict"](examples=examples)
    np.testing.assert_allclose(predict["probabilities"].numpy(), expected, atol=1e-5)
    np.testing.assert_array_equal(predict["class_ids"].numpy()[:, 0], np.argmax(expected, 1))


def test_exports_faster_than_one_a_second_stay_in_order_when_old_ones_are_deleted(
    tmp_path, monkeypatch
):
    """LatestExporter keeps the newest timestamps: a new export must always be the newest."""
    columns = [tf.compat.v1.feature_column.numeric_column(k) for k in IRIS_FEATURES]
    est = E.Estimator(
        iris_model_fn,
        model_dir=str(tmp_path / "model"),
        params={"feature_columns": columns, "hidden_units": [4], "n_classes": 3},
        config=E.RunConfig(log_step_count_steps=None, random_seed=0),
    )
    est.train(_iris_input_fn(), steps=2)
    receiver = export.build_parsing_serving_input_receiver_fn(
        tf.compat.v1.feature_column.make_parse_example_spec(columns)
    )
    monkeypatch.setattr("npu_rec.estimator._export.time.time", lambda: 1_700_000_000.5)
    base = tmp_path / "export"
    paths = []
    for _ in range(4):  # all in the same second
        paths.append(est.export_saved_model(str(base), receiver).decode())
        kept = sorted(os.listdir(base), key=int)
        assert os.path.basename(paths[-1]) == kept[-1]  # the newest directory is this export
        for old in kept[:-2]:  # what LatestExporter(exports_to_keep=2) deletes
            shutil.rmtree(base / old)
    assert [int(os.path.basename(p)) for p in paths] == [1_700_000_000 + i for i in range(4)]


def test_deepfm_with_parsing_receiver_and_default_predict_output(tmp_path):
    """DeepFM as public CTR estimators write it: `export_outputs` keyed by the default key."""
    est = E.NPUEstimator(
        models.deepfm_model_fn,
        model_dir=str(tmp_path / "model"),
        params={"export_outputs": True},
        config=E.NPURunConfig(log_step_count_steps=None, random_seed=1),
    )
    est.train(models.synthetic_input_fn(0, 1280), max_steps=20)
    spec = {
        "cat": tf.io.FixedLenFeature([models.NUM_CAT], tf.int64),
        "dense": tf.io.FixedLenFeature([models.NUM_DENSE], tf.float32),
    }
    path = est.export_saved_model(
        str(tmp_path / "export"),
        export.build_parsing_serving_input_receiver_fn(spec),
        assets_extra={"vocab/readme.txt": __file__},
    )
    features, labels = models.synthetic_arrays(1280, 1344)
    expected = [p["probabilities"] for p in est.predict(models.make_input_fn(features, labels))]
    served = tf.saved_model.load(path.decode())
    assert set(served.signatures) == {"serving_default"}
    out = served.signatures["serving_default"](examples=tf.constant(_examples(features)))
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=1e-6)
    assert os.path.exists(os.path.join(path.decode(), "assets.extra", "vocab", "readme.txt"))
    assert sorted(os.listdir(tmp_path / "export")) == [os.path.basename(path.decode())]


def test_mnist_style_named_output_is_also_the_default(tmp_path):
    """official/mnist: `export_outputs={"classify": PredictOutput(predictions)}`, raw receiver."""

    def model_fn(features, labels, mode):
        logits = keras.layers.Dense(3)(features["image"])
        predictions = {"classes": tf.argmax(logits, axis=1), "probabilities": tf.nn.softmax(logits)}
        if mode == E.ModeKeys.PREDICT:
            return E.EstimatorSpec(
                mode=E.ModeKeys.PREDICT,
                predictions=predictions,
                export_outputs={"classify": export.PredictOutput(predictions)},
            )
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
        return E.EstimatorSpec(
            mode,
            loss=loss,
            train_op=tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
                loss, tf.compat.v1.train.get_or_create_global_step()
            ),
        )

    x = np.random.RandomState(0).rand(16, 5).astype(np.float32)
    y = np.arange(16) % 3

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"image": x}, y)).batch(8)

    est = E.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    est.train(input_fn, steps=2)
    path = est.export_saved_model(
        str(tmp_path / "export"),
        export.build_raw_serving_input_receiver_fn({"image": tf.zeros([1, 5])}),
    )
    served = tf.saved_model.load(path.decode())
    assert set(served.signatures) == {"classify", "serving_default"}
    expected = [p["probabilities"] for p in est.predict(input_fn)]
    for name in ("classify", "serving_default"):
        out = served.signatures[name](image=tf.constant(x))
        np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=1e-6)


def test_a_classification_output_over_raw_inputs_is_left_out(tmp_path):
    def model_fn(features, labels, mode):
        w = tf.compat.v1.get_variable("w", [2, 2])
        probs = tf.nn.softmax(tf.matmul(features["x"], w))
        if mode == E.ModeKeys.PREDICT:
            return E.EstimatorSpec(
                mode,
                predictions=probs,
                export_outputs={
                    "serving_default": export.PredictOutput(probs),
                    "classify": export.ClassificationOutput(scores=probs),
                },
            )
        loss = tf.reduce_sum(probs)
        return E.EstimatorSpec(
            mode,
            loss=loss,
            train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                loss, tf.compat.v1.train.get_global_step()
            ),
        )

    est = E.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    est.train(lambda: ({"x": tf.ones([2, 2])}, tf.zeros([2])), steps=1)
    path = est.export_saved_model(
        str(tmp_path / "e"),
        export.build_raw_serving_input_receiver_fn({"x": tf.TensorSpec([None, 2])}),
    )
    assert set(tf.saved_model.load(path.decode()).signatures) == {"serving_default"}


def test_export_output_and_receiver_rules():
    with tf.Graph().as_default():
        probs = tf.zeros([2, 3])
        with pytest.raises(ValueError, match="`scores` must be a float Tensor"):
            export.ClassificationOutput(scores=tf.zeros([2], tf.int32))
        with pytest.raises(ValueError, match="`classes` must be a string Tensor"):
            export.ClassificationOutput(classes=tf.zeros([2], tf.int64))
        with pytest.raises(ValueError, match="needs `scores`, `classes` or both"):
            export.ClassificationOutput()
        with pytest.raises(ValueError, match="`value` must be a float Tensor"):
            export.RegressionOutput(tf.zeros([2], tf.int64))
        with pytest.raises(ValueError, match="Prediction output values must be Tensors"):
            export.PredictOutput({"p": 3})
        with pytest.raises(ValueError, match=r"Several `export_outputs` \['a', 'b'\]"):
            E.EstimatorSpec(
                E.ModeKeys.PREDICT,
                predictions=probs,
                export_outputs={"a": export.PredictOutput(probs), "b": export.PredictOutput(probs)},
            )
        with pytest.raises(TypeError, match=r"`export_outputs\['a'\]` must be an"):
            E.EstimatorSpec(E.ModeKeys.PREDICT, predictions=probs, export_outputs={"a": probs})
        spec = E.EstimatorSpec(E.ModeKeys.PREDICT, predictions=probs)
        assert list(spec.export_outputs) == ["serving_default"]
        receiver = export.ServingInputReceiver(probs, probs)
        assert list(receiver.features) == ["feature"] and list(receiver.receiver_tensors) == [
            "input"
        ]
        assert export.TensorServingInputReceiver(probs, probs).features is probs
        with pytest.raises(ValueError, match="`receiver_tensors` must be a tensor"):
            export.ServingInputReceiver(probs, None)
        with pytest.raises(ValueError, match=r"`features\['a'\]` must be a Tensor"):
            export.ServingInputReceiver({"a": 1}, probs)


GENRES = ["comedy", "drama", "horror", "news"]


def vocabulary_model_fn(features, labels, mode, params):
    """A feature-column model_fn: a vocabulary-list column, a vocabulary-file column, a number."""
    net = tf.compat.v1.feature_column.input_layer(features, params["columns"])
    logits = keras.layers.Dense(1)(net)[:, 0]
    predictions = {"probability": tf.sigmoid(logits)}
    if mode == E.ModeKeys.PREDICT:
        return E.EstimatorSpec(mode, predictions=predictions)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return E.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_vocabulary_columns_export_and_serve_without_npu_rec(tmp_path):
    """The SavedModel's main op initialises the lookup tables (tf.estimator's exports do)."""
    vocab = tmp_path / "cities.txt"
    vocab.write_text("paris\nrome\noslo\n")
    fc = tf.compat.v1.feature_column
    columns = [
        fc.indicator_column(fc.categorical_column_with_vocabulary_list("genre", GENRES)),
        fc.indicator_column(fc.categorical_column_with_vocabulary_file("city", str(vocab), 3)),
        fc.numeric_column("age"),
    ]
    rng = np.random.RandomState(0)
    n = 64
    genre = np.array(GENRES)[rng.randint(0, 4, n)]
    city = np.array(["paris", "rome", "oslo", "lima"])[rng.randint(0, 4, n)]
    age = rng.rand(n).astype(np.float32)
    labels = ((genre == "drama") | (city == "rome")).astype(np.float32)
    features = {"genre": genre, "city": city, "age": age}

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((features, labels)).repeat(20).batch(16)

    est = E.Estimator(
        vocabulary_model_fn,
        model_dir=str(tmp_path / "m"),
        params={"columns": columns},
        config=E.RunConfig(log_step_count_steps=None),
    )
    est.train(input_fn, steps=40)
    expected = [p["probability"] for p in est.predict(lambda: input_fn().take(4))]
    parsing = est.export_saved_model(
        str(tmp_path / "parsing"),
        export.build_parsing_serving_input_receiver_fn(fc.make_parse_example_spec(columns)),
    )
    raw = est.export_saved_model(
        str(tmp_path / "raw"),
        export.build_raw_serving_input_receiver_fn(
            {
                "genre": tf.TensorSpec([None], tf.string),
                "city": tf.TensorSpec([None], tf.string),
                "age": tf.TensorSpec([None], tf.float32),
            }
        ),
    )
    vocab.unlink()  # served from the SavedModel's assets
    examples = []
    for g, c, a in zip(genre, city, age, strict=True):
        feature = {
            "genre": tf.train.Feature(bytes_list=tf.train.BytesList(value=[g.encode()])),
            "city": tf.train.Feature(bytes_list=tf.train.BytesList(value=[c.encode()])),
            "age": tf.train.Feature(float_list=tf.train.FloatList(value=[a])),
        }
        examples.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    np.save(tmp_path / "examples.npy", np.array(examples, dtype=object), allow_pickle=True)
    np.savez(tmp_path / "raw.npz", genre=genre, city=city, age=age)
    code = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf
        examples = np.load({str(tmp_path / "examples.npy")!r}, allow_pickle=True).tolist()
        f = tf.saved_model.load({parsing.decode()!r}).signatures["serving_default"]
        a = f(examples=tf.constant(examples))["probability"].numpy()
        raw = np.load({str(tmp_path / "raw.npz")!r})
        g = tf.saved_model.load({raw.decode()!r}).signatures["serving_default"]
        b = g(**{{k: tf.constant(raw[k]) for k in ("genre", "city", "age")}})
        np.save({str(tmp_path / "served.npy")!r}, np.stack([a, b["probability"].numpy()]))
        assert "npu_rec" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/", timeout=240)
    served = np.load(tmp_path / "served.npy")
    np.testing.assert_allclose(served[0], expected, atol=1e-6)
    np.testing.assert_allclose(served[1], expected, atol=1e-6)
