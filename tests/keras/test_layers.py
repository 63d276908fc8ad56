"""SparseEmbedding: shapes, combiners, config round-trip, errors, the plain-Model guard."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import npu_rec
from npu_rec.keras import RecModel, SparseEmbedding, TableNotTrainedError


class SparseEmbeddingTest(parameterized.TestCase):
    def setUp(self):
        npu_rec.shutdown()
        npu_rec.table._registry.clear()

    @parameterized.named_parameters(
        ("scalar_ids", [5, 7, 5], None, (3, 4)),
        ("matrix_ids", [[1, 2], [3, 4]], None, (2, 2, 4)),
        ("multi_hot_sum", [[1, 2, 3], [3, 4, 5]], "sum", (2, 4)),
        ("multi_hot_mean", [[1, 2, 3], [3, 4, 5]], "mean", (2, 4)),
    )
    def test_output_shapes(self, ids, combiner, shape):
        layer = SparseEmbedding("t", 4, combiner=combiner)
        out = layer(tf.constant(ids, tf.int64))
        self.assertEqual(tuple(out.shape), shape)
        self.assertEqual(out.dtype, tf.float32)

    def test_ragged_ids_with_combiner_average_rows(self):
        layer = SparseEmbedding("t", 3, combiner="mean")
        ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
        out = layer(ids).numpy()
        single = layer(tf.constant([1, 2, 3], tf.int64)).numpy()
        np.testing.assert_allclose(out[0], single[:2].mean(0), rtol=1e-6)
        np.testing.assert_allclose(out[1], single[2], rtol=1e-6)

    def test_sparse_ids_multi_hot(self):
        layer = SparseEmbedding("t", 3, combiner="sum")
        ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
        self.assertEqual(tuple(layer(ids).shape), (2, 3))

    def test_wraps_an_existing_table(self):
        table = npu_rec.create_table("given", 6)
        layer = SparseEmbedding(table)
        self.assertIs(layer.table, table)
        self.assertEqual(layer.dim, 6)
        with pytest.raises(ValueError, match="dim"):
            SparseEmbedding(table, 3)

    def test_table_created_in_build_with_table_arguments(self):
        layer = SparseEmbedding(
            "built", 4, access_threshold=2, optimizer=npu_rec.optimizers.SGD(0.5)
        )
        self.assertIsNone(layer._table)
        layer.build((None,))
        self.assertEqual(layer.table.config.access_threshold, 2)
        self.assertIsInstance(layer.table.optimizer, npu_rec.optimizers.SGD)

    def test_config_round_trip(self):
        layer = SparseEmbedding(
            "rt",
            5,
            combiner="sqrtn",
            access_threshold=3,
            eviction_threshold=60,
            capacity=128,
            optimizer=npu_rec.optimizers.Adam(0.01),
            initializer=keras.initializers.RandomNormal(seed=1),
        )
        config = layer.get_config()
        npu_rec.table._registry.clear()
        clone = SparseEmbedding.from_config(config)
        self.assertEqual(clone.get_config(), config)
        clone.build((None, 3))
        self.assertEqual(clone.table.config.eviction_threshold, 60)
        self.assertEqual(
            clone.table.optimizer.get_config(), npu_rec.optimizers.Adam(0.01).get_config()
        )

    @parameterized.named_parameters(
        ("no_dim", dict(table_or_name="x"), ValueError, "`dim` must be an integer >= 1"),
        (
            "bad_combiner",
            dict(table_or_name="x", dim=2, combiner="max"),
            ValueError,
            "`combiner` must be",
        ),
        ("unknown_kwarg", dict(table_or_name="x", dim=2, vocab=3), TypeError, "unknown"),
        ("not_a_table", dict(table_or_name=3, dim=2), TypeError, "table_or_name"),
    )
    def test_argument_errors(self, kwargs, error, message):
        with pytest.raises(error, match=message):
            SparseEmbedding(**kwargs)

    def test_non_training_lookup_reads_zeros_for_unknown_ids(self):
        layer = SparseEmbedding("z", 2)
        np.testing.assert_array_equal(
            layer(tf.constant([99], tf.int64), training=False), np.zeros((1, 2))
        )
        self.assertEqual(int(layer.table.size()), 0)

    def test_plain_keras_model_fit_raises_pointing_to_recmodel(self):
        ids = keras.Input(shape=(), dtype="int64")
        out = keras.layers.Dense(1)(
            SparseEmbedding("plain", 2, optimizer=npu_rec.optimizers.SGD(0.1))(ids)
        )
        model = keras.Model(ids, out)
        model.compile(optimizer="sgd", loss="mse")
        with pytest.raises(TableNotTrainedError, match="RecModel"):
            model.fit(np.arange(8), np.zeros(8), epochs=1, verbose=0)
        self.assertEqual(int(model.layers[1].table.size()), 0)

    def test_subclassed_recmodel_trains_its_table(self):
        class TwoTower(RecModel):
            def __init__(self):
                super().__init__()
                self.user = SparseEmbedding("user", 4, optimizer=npu_rec.optimizers.SGD(0.5))
                self.item = SparseEmbedding("item", 4, optimizer=npu_rec.optimizers.SGD(0.5))

            def call(self, inputs, training=None):
                u = self.user(inputs["user"], training=training)
                i = self.item(inputs["item"], training=training)
                return tf.reduce_sum(u * i, axis=-1, keepdims=True)

        model = TwoTower()
        model.compile(optimizer="sgd", loss="mse")
        x = {"user": np.array([1, 2, 3, 4]), "item": np.array([10, 20, 30, 40])}
        y = np.ones((4, 1), "float32")
        first = model.evaluate(x, y, verbose=0)
        model.fit(x, y, epochs=20, verbose=0)
        self.assertLess(model.evaluate(x, y, verbose=0), first / 2)
        self.assertEqual([int(t.size()) for t in model.tables], [4, 4])


def _multi_valued_csv(path, rows=48, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        f.write("click,tags\n")
        for _ in range(rows):
            tags = "|".join(str(t) for t in rng.integers(0, 50, rng.integers(1, 5)))
            f.write(f"{rng.integers(0, 2)},{tags}\n")
    return str(path)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combiner_output_has_a_static_shape_inside_fit(tmp_path, combiner):
    # Ragged multi-valued ids from as_dataset (its default), a Dense right after the
    # combined embedding, built inside fit: no user-written tf.ensure_shape.
    import npu_rec.data

    npu_rec.table._registry.clear()
    source = npu_rec.data.CsvSource(
        _multi_valued_csv(tmp_path / "t.csv"), label="click", multi_valued=["tags"]
    )
    ds = npu_rec.data.as_dataset(source, 16)
    assert isinstance(ds.element_spec[0]["tags"], tf.RaggedTensorSpec)
    seen = []

    class Tags(RecModel):
        def __init__(self):
            super().__init__()
            self.tags = SparseEmbedding(
                "tags", 4, combiner=combiner, optimizer=npu_rec.optimizers.SGD(0.1)
            )
            self.out = keras.layers.Dense(1, activation="sigmoid")

        def call(self, x, training=None):
            emb = self.tags(x["tags"], training=training)
            seen.append(tuple(emb.shape))
            return self.out(emb)

    model = Tags()
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    history = model.fit(ds, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    assert seen and all(s == (None, 4) for s in seen)
    assert model.global_step == 3
    assert int(model.tables[0].size()) > 0


@pytest.mark.parametrize(
    "ids",
    [
        tf.ragged.constant([[1, 2], [3]], dtype=tf.int64),
        tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64)),
        tf.constant([[1, 2], [3, 4]], tf.int64),
        tf.constant([1, 2], tf.int64),
    ],
)
def test_combiner_output_shape_is_declared_in_a_traced_call(ids):
    npu_rec.table._registry.clear()
    layer = SparseEmbedding("traced", 3, combiner="sum")
    spec = tf.type_spec_from_value(ids)
    spec = (
        spec._unbatch()._batch(None)
        if not isinstance(ids, tf.SparseTensor)
        else (tf.SparseTensorSpec([None, None], tf.int64))
    )
    traced = tf.function(lambda x: layer(x)).get_concrete_function(spec)
    assert traced.structured_outputs.shape.as_list() == [None, 3]
    assert tuple(layer.compute_output_shape(tuple(spec.shape))) == (None, 3)
    assert tuple(layer(ids).shape) == (2, 3)


def test_config_round_trip_with_a_table_learning_rate_schedule():
    import json

    schedule = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=100)
    layer = SparseEmbedding("sched", 4, optimizer=npu_rec.optimizers.Adagrad(schedule))
    config = json.loads(json.dumps(layer.get_config()))
    npu_rec.table._registry.clear()
    clone = SparseEmbedding.from_config(config)
    clone.build((None,))
    rate = clone.table.optimizer.learning_rate
    assert isinstance(rate, keras.optimizers.schedules.CosineDecay)
    assert rate.get_config() == schedule.get_config()
    plain = SparseEmbedding("plain_lr", 4, optimizer=npu_rec.optimizers.SGD(lambda step: 0.1))
    with pytest.raises(ValueError, match="cannot serialise its learning_rate"):
        plain.get_config()


def test_a_layer_takes_the_tier_arguments_of_create_table(tmp_path):
    layer = SparseEmbedding(
        "tiered_layer",
        4,
        optimizer=npu_rec.optimizers.Adagrad(0.1),
        access_threshold=0,
        memory_rows=2,
        ssd_path=str(tmp_path),
    )
    layer(tf.constant([[1, 2, 3]], tf.int64))
    assert layer.table.config.memory_rows == 2
    assert layer.get_config()["memory_rows"] == 2
    with pytest.raises(ValueError, match="needs both `memory_rows` and `ssd_path`"):
        SparseEmbedding("half_tiered", 4, memory_rows=2)(tf.constant([[1]], tf.int64))
