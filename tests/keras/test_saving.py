"""model.save / load_model round-trips with tables; the serving SavedModel in a fresh process."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding, export_for_serving


@pytest.fixture(scope="module")
def trained():
    """One trained model for the save/load and the export tests (tracing is the cost)."""
    keras.utils.set_random_seed(0)
    user = keras.Input(shape=(), dtype="int64", name="user")
    tags = keras.Input(shape=(3,), dtype="int64", name="tags")
    dense = keras.Input(shape=(2,), dtype="float32", name="feats")
    u = SparseEmbedding("user", 4, optimizer=npu_rec.optimizers.Adagrad(0.1), access_threshold=2)(
        user
    )
    t = SparseEmbedding(  # bfloat16 rows: saved, loaded and served like float32 ones
        "tag", 4, combiner="mean", optimizer=npu_rec.optimizers.Adam(0.01), value_dtype="bfloat16"
    )(tags)
    h = keras.layers.Concatenate()([u, t, dense])
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, "relu")(h))
    model = RecModel({"user": user, "tags": tags, "feats": dense}, out)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc"])
    rng = np.random.default_rng(0)
    x = {
        "user": rng.integers(0, 50, 256) * 1_000_003 + 2**40,
        "tags": rng.integers(0, 30, (256, 3)),
        "feats": rng.normal(size=(256, 2)).astype("float32"),
    }
    model.fit(x, (x["user"] % 2).astype("float32"), batch_size=32, epochs=2, verbose=0)
    probe = {
        "user": np.concatenate([x["user"][:8], [12345]]),  # the last id is unknown
        "tags": np.concatenate([x["tags"][:8], [[999, 998, 1]]]),
        "feats": np.concatenate([x["feats"][:8], [[0.5, -0.5]]]).astype("float32"),
    }
    return model, x, probe


def test_save_and_load_model_give_identical_predictions_and_tables(tmp_path, trained):
    model, x, probe = trained
    expected = model.predict(probe, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # same process: takes over the table names
    assert isinstance(loaded, RecModel)
    np.testing.assert_array_equal(loaded.predict(probe, verbose=0), expected)
    for old, new in zip(model.tables, loaded.tables, strict=True):
        assert old is not new and old.name == new.name
        a, b = old.export(), new.export()
        np.testing.assert_array_equal(a["keys"], b["keys"])
        np.testing.assert_array_equal(a["values"], b["values"])
        for slot in a["slots"]:
            np.testing.assert_array_equal(a["slots"][slot], b["slots"][slot])
    assert npu_rec.table._registry.get("user") is loaded.tables[0]
    assert loaded.tables[1].config.value_dtype == tf.bfloat16
    assert loaded.tables[1].export()["values"].dtype.name == "bfloat16"
    # The loaded model is compiled and keeps training its tables.
    before = loaded.tables[0].export()["values"].copy()
    loaded.fit(x, (x["user"] % 2).astype("float32"), batch_size=32, epochs=1, verbose=0)
    assert not np.array_equal(loaded.tables[0].export()["values"], before)


def test_wrapper_form_round_trips(tmp_path):
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    net = keras.Model(
        ids,
        keras.layers.Dense(1)(SparseEmbedding("w", 2, optimizer=npu_rec.optimizers.SGD(0.1))(ids)),
    )
    model = RecModel(network=net, loss_fn="mse", optimizer="sgd", amp_level="O0")
    model.fit(np.arange(16), np.ones(16), epochs=1, verbose=0)
    model.save(str(tmp_path / "w.keras"))
    loaded = keras.models.load_model(str(tmp_path / "w.keras"))
    np.testing.assert_array_equal(
        loaded.predict(np.arange(20), verbose=0), model.predict(np.arange(20), verbose=0)
    )


SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
probe = {k: np.asarray(v) for k, v in json.loads(sys.argv[1]).items()}
results = {}
for export_dir in sys.argv[2:]:
    served = tf.saved_model.load(export_dir)
    out = served.signatures["serving_default"](
        user=tf.constant(probe["user"], tf.int64), tags=tf.constant(probe["tags"], tf.int64),
        feats=tf.constant(probe["feats"], tf.float32))["output_0"].numpy()
    # Keras' way to call an exported model: `.serve` with the model's input structure.
    serve_out = served.serve({
        "user": tf.constant(probe["user"], tf.int64), "tags": tf.constant(probe["tags"], tf.int64),
        "feats": tf.constant(probe["feats"], tf.float32)}).numpy()
    results[export_dir] = {"out": out.tolist(), "serve_out": serve_out.tolist()}
print(json.dumps({"npu_rec_imported": "npu_rec" in sys.modules, "results": results}))
"""
EXPORTS = ["export_for_serving", "model.export", "model.export+signature"]


def _export(model, export_dir: str, how: str) -> None:
    if how == "model.export":  # Keras' own export call, as a Keras user writes it
        model.export(export_dir)
    elif how == "model.export+signature":  # Keras' form: one entry per call argument
        specs = {
            "user": keras.InputSpec(shape=(None,), dtype="int64", name="user"),
            "tags": tf.TensorSpec([None, 3], tf.int64, name="tags"),
            "feats": next(t for t in model.inputs if t.name == "feats"),  # symbolic input
        }
        model.export(export_dir, input_signature=[specs])
    else:
        export_for_serving(model, export_dir)


@pytest.fixture(scope="module")
def served(trained, tmp_path_factory):
    """The trained model exported each way, then all served by one fresh process (one
    TensorFlow import) without npu_rec: (the model's predictions, whether that process
    imported npu_rec, {way: its outputs or the export's error})."""
    model, _, probe = trained
    expected = model.predict(probe, verbose=0)
    root = tmp_path_factory.mktemp("serving")
    dirs, outputs = {}, {}
    for i, how in enumerate(EXPORTS):
        try:
            _export(model, str(root / f"export{i}"), how)
            dirs[how] = str(root / f"export{i}")
        except Exception as err:  # reported by that way's test
            outputs[how] = err
    arg = json.dumps({k: v.tolist() for k, v in probe.items()})
    result = subprocess.run(
        [sys.executable, "-c", SERVE, arg, *dirs.values()],
        capture_output=True,
        text=True,
        timeout=180,
        env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    outputs.update({how: answer["results"][d] for how, d in dirs.items()})
    return expected, answer["npu_rec_imported"], outputs


@pytest.mark.parametrize("how", EXPORTS)
def test_exported_saved_model_serves_raw_ids_without_npu_rec(served, how):
    expected, npu_rec_imported, outputs = served
    if isinstance(outputs[how], Exception):
        raise outputs[how]
    assert npu_rec_imported is False
    np.testing.assert_allclose(np.array(outputs[how]["out"]), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(outputs[how]["serve_out"]), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"format": "onnx"}, "format='tf_saved_model' only.*format='onnx'"),
        ({"is_static": True}, r"no options.*\['is_static'\]"),
        ({"input_signature": {"user": None}}, "list with one entry.*Received: input_signature"),
    ],
)
def test_model_export_refuses_other_formats_and_options_and_writes_nothing(
    tmp_path, trained, kwargs, match
):
    model, _, _ = trained
    with pytest.raises(ValueError, match=match):
        model.export(str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["RecModel", "keras.Model"])
def test_tf_saved_model_save_explains_the_exports_and_writes_nothing(tmp_path, trained, kind):
    model, x, _ = trained
    if kind == "keras.Model":  # the same layers in a plain Keras model
        model = keras.Model(model.inputs, model.outputs)
    out = tmp_path / "sm"
    with pytest.raises(ValueError, match=r"tf.saved_model.save cannot write.*model.export"):
        tf.saved_model.save(model, str(out))
    assert not (out / "saved_model.pb").exists()
    # A checkpoint of the same model (the other traversal of its objects) still works.
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt" / "c"))
    assert tf.train.load_checkpoint(path).get_variable_to_shape_map()


def test_a_sharded_layer_round_trips_its_shard_count_and_trains(tmp_path):
    keras.utils.set_random_seed(0)
    layer = SparseEmbedding(
        "sharded_ids",
        3,
        num_shards=3,
        access_threshold=0,
        optimizer=npu_rec.optimizers.SGD(0.5),
        name="sharded",
    )
    config = json.loads(json.dumps(layer.get_config()))
    assert config["num_shards"] == 3
    npu_rec.table._registry.clear()  # the clone takes over the name
    clone = SparseEmbedding.from_config(config)
    assert isinstance(clone.table, npu_rec.ShardedTable)
    assert clone.table.num_shards == 3 and clone.get_config() == config

    npu_rec.table._registry.clear()
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    model = RecModel(ids, keras.layers.Dense(1)(SparseEmbedding.from_config(config)(ids)))
    model.compile(optimizer="sgd", loss="mse")
    x = np.arange(64) * 7_919 + 2**35
    model.fit(x, np.ones(64), batch_size=16, epochs=2, verbose=0)
    table = model.tables[0]
    assert isinstance(table, npu_rec.ShardedTable) and table.size() == 64
    assert all(s.size() > 0 for s in table.shards)  # every shard holds keys
    path = str(tmp_path / "sharded.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.tables[0], npu_rec.ShardedTable)
    assert loaded.tables[0].num_shards == 3
    np.testing.assert_array_equal(loaded.tables[0].export()["values"], table.export()["values"])
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
