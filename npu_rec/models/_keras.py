"""The reference models as Keras 3 functional models and `npu_rec.keras.RecModel`s.

`build_deepfm`, `build_wide_deep` and `build_dlrm` take an
`embedding_fn(name, ids, dim)`, so the same network runs over hashed Keras
embeddings (`hashed_embedding_fn`) or npu_rec sparse tables
(`sparse_embedding_fn`). `build_rec_model` puts it together from a list of
`FeatureSpec`s: a `RecModel` whose embeddings live in sparse tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import keras
from keras import layers, ops

from npu_rec.keras import RecModel, SparseEmbedding
from npu_rec.models import _networks
from npu_rec.models._features import FeatureTables, default_sparse_optimizer, grouped_embed


def hashed_embedding_fn(num_buckets: int, seed: int | None = None) -> Callable:
    """Returns an `embedding_fn` that hashes raw int64 ids into `num_buckets` rows.

    Each feature gets its own `keras.layers.Embedding` of `num_buckets` rows;
    a raw id `x` maps to row `x mod num_buckets` (collisions share rows).
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(
            f"`num_buckets` must be an integer >= 1. Received: num_buckets={num_buckets!r}"
        )

    def embed(name: str, ids, dim: int):
        layer = layers.Embedding(
            num_buckets,
            dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.01, seed=seed),
            name=f"{name}_emb{dim}",
        )
        return layer(ops.mod(ids, num_buckets))

    return embed


def sparse_embedding_fn(tables: FeatureTables) -> Callable:
    """Returns an `embedding_fn` over npu_rec sparse tables, as `tables` describes.

    One `npu_rec.keras.SparseEmbedding` layer per table (shared by the
    features that share the table); keys are salted per feature when shared.
    """
    made: dict[str, SparseEmbedding] = {}

    def embed(name: str, ids, dim: int):
        spec = tables.spec_of(name)
        table = tables.table_name(spec, dim)
        if table not in made:
            made[table] = SparseEmbedding(
                table, dim, name=f"{table}_embedding", **tables.table_kwargs(spec)
            )
        return made[table](tables.keys(spec, ids))

    return embed


def _build(
    model: str,
    dense_names,
    categorical_names,
    embedding_fn,
    *,
    seed,
    model_class,
    embed_factory=None,
    **arch,
):
    inputs = {n: keras.Input(shape=(), dtype="float32", name=n) for n in dense_names}
    inputs.update({n: keras.Input(shape=(), dtype="int64", name=n) for n in categorical_names})
    init = keras.initializers.GlorotUniform(seed=seed)

    def layer(name, units, activation):
        return layers.Dense(units, activation=activation, kernel_initializer=init, name=name)

    def embed(name, dim):
        return embedding_fn(name, inputs[name], dim)

    if embed_factory is not None:
        embed = embed_factory(inputs)

    dense = _networks.dense_block([inputs[n] for n in dense_names])
    logit = _networks.logit_fn(model)(dense, list(categorical_names), embed, layer, **arch)
    prob = layers.Activation("sigmoid", name="prob")(logit)
    names = {"deepfm": "deepfm", "wdl": "wide_deep", "dlrm": "dlrm"}
    return model_class(inputs=inputs, outputs=prob, name=names[model])


def build_deepfm(
    dense_names: Sequence[str],
    categorical_names: Sequence[str],
    embedding_fn: Callable,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (128, 64),
    seed: int | None = None,
    model_class: type = keras.Model,
) -> keras.Model:
    """Builds a DeepFM click model (network: `npu_rec.models.deepfm_logit`).

    Args:
      dense_names: dense input names; each input is float32 `[batch]`.
      categorical_names: categorical input names; each input is int64 `[batch]` of raw ids.
      embedding_fn: `embedding_fn(name, ids, dim) -> float32 [batch, dim]`.
      embedding_dim: size of the factor (second-order) embeddings.
      hidden_units: widths of the deep part's hidden layers.
      seed: seeds the dense layers' initialisers.
      model_class: `keras.Model` or `npu_rec.keras.RecModel` (needed for sparse tables).

    Returns:
      A model from a dict of the named inputs to the click probability, float32 `[batch, 1]`.
    """
    return _build(
        "deepfm",
        dense_names,
        categorical_names,
        embedding_fn,
        seed=seed,
        model_class=model_class,
        embedding_dim=embedding_dim,
        hidden_units=hidden_units,
    )


def build_wide_deep(
    dense_names: Sequence[str],
    categorical_names: Sequence[str],
    embedding_fn: Callable,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (128, 64),
    seed: int | None = None,
    model_class: type = keras.Model,
) -> keras.Model:
    """Builds a Wide & Deep click model (network: `npu_rec.models.wide_deep_logit`).

    Args and returns as `build_deepfm`.
    """
    return _build(
        "wdl",
        dense_names,
        categorical_names,
        embedding_fn,
        seed=seed,
        model_class=model_class,
        embedding_dim=embedding_dim,
        hidden_units=hidden_units,
    )


def build_dlrm(
    dense_names: Sequence[str],
    categorical_names: Sequence[str],
    embedding_fn: Callable,
    *,
    embedding_dim: int = 16,
    bottom_units: Sequence[int] = (64, 16),
    top_units: Sequence[int] = (256, 128),
    interaction: str = "dot",
    seed: int | None = None,
    model_class: type = keras.Model,
) -> keras.Model:
    """Builds a DLRM click model (network: `npu_rec.models.dlrm_logit`).

    Args:
      dense_names, categorical_names, embedding_fn, seed, model_class: as `build_deepfm`.
      embedding_dim: embedding width; the bottom MLP's last width must equal it.
      bottom_units: widths of the bottom MLP.
      top_units: hidden widths of the top MLP (a final 1-unit layer is added).
      interaction: "dot" (pairwise dot products) or "cat" (concatenation).

    Returns:
      A model from the named inputs to the click probability, float32 `[batch, 1]`.

    Raises:
      ValueError: `interaction` is unknown, or `bottom_units[-1] != embedding_dim`.
    """
    _networks.check_dlrm_args(embedding_dim, bottom_units, interaction)
    return _build(
        "dlrm",
        dense_names,
        categorical_names,
        embedding_fn,
        seed=seed,
        model_class=model_class,
        embedding_dim=embedding_dim,
        bottom_units=bottom_units,
        top_units=top_units,
        interaction=interaction,
    )


_BUILDERS = {"deepfm": build_deepfm, "wdl": build_wide_deep, "dlrm": build_dlrm}


def build_rec_model(
    model: str,
    feature_specs: Sequence,
    dense_names: Sequence[str] = (),
    *,
    embedding_dim: int | None = None,
    sparse_optimizer: Callable | None = None,
    seed: int | None = None,
    value_dtype="float32",
    table_options: Mapping | None = None,
    **arch,
) -> RecModel:
    """A reference model as an `npu_rec.keras.RecModel` over sparse tables.

    Example:
      >>> specs = [FeatureSpec(f"C{i}", access_threshold=1) for i in range(1, 27)]
      >>> model = build_rec_model("deepfm", specs, DENSE_NAMES, embedding_dim=8)
      >>> model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc"])

    Args:
      model: "deepfm", "wdl" or "dlrm".
      feature_specs: `npu_rec.data.FeatureSpec`s: which input feeds which
        table, with which admission/eviction thresholds.
      dense_names: dense input names (float32 `[batch]` each).
      embedding_dim: factor width (default 8; DLRM 16, and its bottom MLP ends there).
      sparse_optimizer: zero-argument callable making each table's sparse
        optimizer (default `Adagrad(0.05)`).
      value_dtype: the tables' row storage dtype ("float32", "bfloat16",
        "float16"; `npu_rec.create_table`'s `value_dtype`).
      table_options: further `create_table` arguments of every table, e.g.
        `{"not_admitted": "hashed"}`.
      seed: seeds the dense layers' initialisers.
      **arch: further arguments of the builder (`hidden_units`, `top_units`, ...).

    Returns:
      An uncompiled `RecModel`: inputs the dense names and the specs'
      `index_key`s, output the click probability float32 `[batch, 1]`.
    """
    if model not in _BUILDERS:
        raise ValueError(f"`model` must be one of {list(_BUILDERS)}. Received: model={model!r}")
    tables = FeatureTables(
        tuple(feature_specs),
        sparse_optimizer=sparse_optimizer or default_sparse_optimizer,
        value_dtype=value_dtype,
        table_options=table_options,
    )
    if embedding_dim is not None:
        arch["embedding_dim"] = embedding_dim
        if model == "dlrm" and "bottom_units" not in arch:
            arch["bottom_units"] = (64, embedding_dim)
    layers_by_table: dict[str, SparseEmbedding] = {}

    def lookup(table, dim, spec, keys):
        if table not in layers_by_table:
            layers_by_table[table] = SparseEmbedding(
                table, dim, name=f"{table}_embedding", **tables.table_kwargs(spec)
            )
        return layers_by_table[table](keys)

    if model == "dlrm":
        _networks.check_dlrm_args(
            arch.get("embedding_dim", 16),
            arch.get("bottom_units", (64, 16)),
            arch.get("interaction", "dot"),
        )
    return _build(
        model,
        list(dense_names),
        tables.input_names,
        None,
        seed=seed,
        model_class=RecModel,
        embed_factory=lambda inputs: grouped_embed(tables, inputs, lookup),
        **arch,
    )
