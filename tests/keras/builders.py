"""Shared data and model builders of the Keras front-end tests."""

import keras

import npu_rec
from npu_rec.data import SyntheticCriteo
from npu_rec.keras import RecModel, SparseEmbedding
from npu_rec.models import build_deepfm

# The small-vocabulary features carry most of the planted signal.
CATEGORICAL = ("C1", "C2", "C5", "C6", "C8", "C9", "C14")
DENSE = ("I1", "I2", "I3", "I4", "I5", "I6")


def criteo(start, stop, seed=3, categorical=CATEGORICAL):
    rows = SyntheticCriteo(seed=seed).rows(start, stop)
    x = {k: rows[k] for k in tuple(categorical) + DENSE}
    return x, rows["label"].astype("float32")


def deepfm_network(
    prefix="", access_threshold=-1, eviction_threshold=-1, lr=0.05, categorical=CATEGORICAL
):
    """A functional DeepFM whose embeddings are SparseEmbedding layers (tables `<prefix>C1_8`...).

    Each categorical feature has two tables (dim 8 and dim 1); tracing the train
    step costs about a second per table here, so tests that need no AUC pass
    fewer `categorical` features.
    """
    opt = npu_rec.optimizers.Adagrad(lr)

    def embed(name, ids, dim):
        return SparseEmbedding(
            f"{prefix}{name}_{dim}",
            dim,
            optimizer=opt,
            access_threshold=access_threshold,
            eviction_threshold=eviction_threshold,
        )(ids)

    return build_deepfm(
        DENSE, tuple(categorical), embed, embedding_dim=8, hidden_units=(32, 16), seed=0
    )


def deepfm_recmodel(**kwargs):
    keras.utils.set_random_seed(0)
    net = deepfm_network(**kwargs)
    model = RecModel(net.inputs, net.outputs)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc"])
    return model


def table_state(table):
    """{key: row values} of a table's live rows."""
    st = table.export()
    return {int(k): v.copy() for k, v in zip(st["keys"], st["values"], strict=True)}
