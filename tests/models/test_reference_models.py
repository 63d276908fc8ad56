import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_rec.data import CATEGORICAL_NAMES, DENSE_NAMES, SyntheticCriteo
from npu_rec.models import build_deepfm, build_dlrm, build_wide_deep, hashed_embedding_fn
from tests.helpers import auc

BUILDERS = {
    "deepfm": lambda fn: build_deepfm(DENSE_NAMES, CATEGORICAL_NAMES, fn, seed=1),
    "wdl": lambda fn: build_wide_deep(DENSE_NAMES, CATEGORICAL_NAMES, fn, seed=1),
    "dlrm_dot": lambda fn: build_dlrm(DENSE_NAMES, CATEGORICAL_NAMES, fn, seed=1),
    "dlrm_cat": lambda fn: build_dlrm(
        DENSE_NAMES, CATEGORICAL_NAMES, fn, interaction="cat", seed=1
    ),
}


@pytest.fixture(scope="module")
def data():
    rows = SyntheticCriteo(seed=9).rows(0, 24_576)
    labels = rows.pop("label").astype("float32")
    return rows, labels


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_reference_model_learns_the_synthetic_signal(name, data):
    keras.utils.set_random_seed(0)
    rows, labels = data
    model = BUILDERS[name](hashed_embedding_fn(2**11, seed=0))
    model.compile(optimizer=keras.optimizers.Adam(5e-3), loss="binary_crossentropy")
    train = tf.data.Dataset.from_tensor_slices(
        ({k: v[:16_384] for k, v in rows.items()}, labels[:16_384])
    ).batch(512)
    model.fit(train, epochs=2, verbose=0)
    pred = model.predict({k: v[16_384:] for k, v in rows.items()}, batch_size=2048, verbose=0)
    assert pred.shape == (8192, 1)
    assert auc(labels[16_384:], pred[:, 0]) > 0.65


def test_dlrm_interaction_widths():
    fn = hashed_embedding_fn(64)
    dot = build_dlrm(DENSE_NAMES, CATEGORICAL_NAMES, fn)
    cat = build_dlrm(DENSE_NAMES, CATEGORICAL_NAMES, fn, interaction="cat")
    # 27 vectors of width 16: 351 pairwise dots + the bottom output, or their concatenation.
    assert dot.get_layer("top_0").kernel.shape == (351 + 16, 256)
    assert cat.get_layer("top_0").kernel.shape == (27 * 16, 256)


def test_dlrm_argument_errors():
    fn = hashed_embedding_fn(64)
    with pytest.raises(ValueError, match="interaction='sum'"):
        build_dlrm(DENSE_NAMES, CATEGORICAL_NAMES, fn, interaction="sum")
    with pytest.raises(ValueError, match=r"bottom_units=\(64, 8\), embedding_dim=16"):
        build_dlrm(DENSE_NAMES, CATEGORICAL_NAMES, fn, bottom_units=(64, 8))
    with pytest.raises(ValueError, match="num_buckets=0"):
        hashed_embedding_fn(0)


def test_dot_interaction_matches_numpy():
    fn = hashed_embedding_fn(32, seed=3)
    model = build_dlrm(
        ("d",), ("a", "b"), fn, embedding_dim=4, bottom_units=(4,), top_units=(3,), seed=2
    )
    x = {"d": np.array([1.0, 5.0], "float32"), "a": np.array([3, 40]), "b": np.array([7, 9])}
    inner = keras.Model(model.inputs, model.get_layer("top_0").input)
    feats = inner.predict(x, verbose=0)
    bottom = keras.Model(model.inputs, model.get_layer("bottom_0").output).predict(x, verbose=0)
    emb_a = model.get_layer("a_emb4").embeddings.numpy()[x["a"] % 32]
    emb_b = model.get_layer("b_emb4").embeddings.numpy()[x["b"] % 32]
    vecs = np.stack([bottom, emb_a, emb_b], axis=1)
    want = np.concatenate(
        [
            bottom,
            np.stack(
                [
                    (vecs[:, 0] * vecs[:, 1]).sum(1),
                    (vecs[:, 0] * vecs[:, 2]).sum(1),
                    (vecs[:, 1] * vecs[:, 2]).sum(1),
                ],
                axis=1,
            ),
        ],
        axis=1,
    )
    np.testing.assert_allclose(feats, want, rtol=1e-5, atol=1e-6)
