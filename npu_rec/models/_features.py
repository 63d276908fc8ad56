"""How a list of `FeatureSpec`s maps categorical inputs to sparse tables.

Shared by the Keras and Estimator builders, so both front ends create the
same tables with the same settings and look up the same keys:

* the factor (width `embedding_dim`) embeddings of a feature live in table
  `spec.table_name`; its first-order weights (width 1, DeepFM and Wide&Deep)
  in table `<table_name>_linear`;
* a table's admission/eviction thresholds come from its specs
  (`npu_rec.data.table_settings`), -1 when none sets them;
* when several specs share a table, each feature's ids are XORed with
  `npu_rec.data.feature_key_salt(name)` so equal raw ids of different features
  stay different keys (as `npu_rec.data.table_keys` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from keras import ops

import npu_rec
from npu_rec.data import FeatureSpec, feature_key_salt, table_settings, validate_feature_specs


def default_sparse_optimizer():
    """The sparse optimizer of the reference models' tables: Adagrad(0.05)."""
    return npu_rec.optimizers.Adagrad(0.05)


@dataclasses.dataclass(frozen=True)
class FeatureTables:
    """The tables behind a model's categorical inputs (see the module docstring).

    Args:
      specs: the model's `FeatureSpec`s (timestamp specs are ignored).
      sparse_optimizer: a zero-argument callable returning a fresh
        `npu_rec.optimizers` instance for each table.
      share_keys: let features of a shared table share keys (no salt).
      value_dtype: the tables' row storage dtype (`create_table`'s `value_dtype`).
      table_options: further `create_table` arguments of every table (e.g.
        `{"not_admitted": "hashed"}`), or None.
    """

    specs: tuple
    sparse_optimizer: Callable = default_sparse_optimizer
    share_keys: bool = False
    table_options: Mapping | None = None
    value_dtype: Any = "float32"

    def __post_init__(self):
        specs = tuple(s for s in validate_feature_specs(self.specs) if not s.is_timestamp)
        if not specs:
            raise ValueError(
                "A reference model needs at least one categorical FeatureSpec. "
                f"Received: specs={list(self.specs)!r}"
            )
        object.__setattr__(self, "specs", specs)

    @property
    def input_names(self) -> list[str]:
        """The categorical input columns (`index_key`s), in spec order, without repeats."""
        return list(dict.fromkeys(s.index_key for s in self.specs))

    def spec_of(self, input_name: str) -> FeatureSpec:
        for s in self.specs:
            if s.index_key == input_name:
                return s
        raise KeyError(f"No FeatureSpec reads input {input_name!r}")

    @staticmethod
    def table_name(spec: FeatureSpec, dim: int) -> str:
        """The table of `spec`'s embeddings of width `dim` (1 = first-order weights)."""
        return f"{spec.table_name}_linear" if dim == 1 else spec.table_name

    def table_kwargs(self, spec: FeatureSpec) -> dict:
        """`create_table` keyword arguments for `spec`'s table(s)."""
        settings = table_settings(self.specs)[spec.table_name]
        return {
            "optimizer": self.sparse_optimizer(),
            "value_dtype": self.value_dtype,
            "access_threshold": -1
            if settings["access_threshold"] is None
            else settings["access_threshold"],
            "eviction_threshold": -1
            if settings["eviction_threshold"] is None
            else settings["eviction_threshold"],
            **(self.table_options or {}),
        }

    def keys(self, spec: FeatureSpec, ids):
        """The int64 keys `spec` looks up: `ids`, salted when its table is shared."""
        users = [s for s in self.specs if s.table_name == spec.table_name]
        ids = ops.cast(ids, "int64")
        if self.share_keys or len(users) == 1:
            return ids
        return ops.bitwise_xor(ids, np.int64(feature_key_salt(spec.name)))


def grouped_embed(tables: FeatureTables, inputs: dict, lookup: Callable) -> Callable:
    """An `embed(name, dim)` that does one lookup per table for all the features sharing it.

    The first request for a table stacks the (salted) ids of every feature
    of that table into int64 `[batch, k]` and calls `lookup(table_name, dim,
    spec, keys) -> [batch, k, dim]` once; each feature's embedding is its slice.
    One lookup per table instead of one per feature keeps graphs small and fast.

    Args:
      tables: the model's `FeatureTables`.
      inputs: input name -> int ids `[batch]` (Keras symbolic or graph tensors).
      lookup: performs the lookup of a table (a `SparseEmbedding` call or
        `npu_rec.sparse_lookup`).
    """
    cache: dict[str, tuple] = {}

    def embed(name: str, dim: int):
        spec = tables.spec_of(name)
        table = tables.table_name(spec, dim)
        if table not in cache:
            members = [s for s in tables.specs if s.table_name == spec.table_name]
            keys = ops.stack([tables.keys(s, inputs[s.index_key]) for s in members], axis=1)
            cache[table] = (lookup(table, dim, spec, keys), [s.index_key for s in members])
        out, order = cache[table]
        return out[:, order.index(name)]

    return embed


def specs_for(
    categorical_names: Sequence[str],
    *,
    table_name: str | None = None,
    access_threshold: int | None = None,
    eviction_threshold: int | None = None,
) -> list[FeatureSpec]:
    """`FeatureSpec`s of categorical columns with the given thresholds.

    Args:
      categorical_names: the columns.
      table_name: one table shared by all the columns (keys salted per
        feature); None: one table per column.
      access_threshold, eviction_threshold: as `FeatureSpec`.
    """
    return [
        FeatureSpec(
            n,
            table_name=table_name,
            access_threshold=access_threshold,
            eviction_threshold=eviction_threshold,
        )
        for n in categorical_names
    ]
