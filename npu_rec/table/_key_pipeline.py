"""The key pipeline: deduplicate a batch's ids in the input pipeline.

A training `sparse_lookup` starts with `tf.unique_with_counts` of the batch's
ids (about a tenth of a table step on CPU). That work needs nothing from the
table, so it can run in `tf.data`, on the input pipeline's threads, while the
previous training step runs: `prepare_ids` computes the unique keys, the
inverse index and the counts, and `sparse_lookup` accepts the resulting
`PreparedIds` in place of the ids and skips its own unique.

What stays in the step: everything that reads or writes table state (the
hash-map lookup, admission counters, row allocation, last-seen times). Those
depend on the previous step's admissions and evictions, so doing them ahead
would race with it. This is mx_rec's host-side key preparation in spirit,
without its device-side swap.

Example:
    ds = npu_rec.prepare_keys(ds, ["user", "item"]).prefetch(2)
    for features, labels in ds:           # features["user"] is a PreparedIds
        emb = npu_rec.sparse_lookup(table, features["user"])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf


class PreparedIds(NamedTuple):
    """Ids with their batch-level unique keys, made by `prepare_ids`.

    Pass it to `sparse_lookup` (or a Keras `SparseEmbedding`) in place of `ids`.

    Attributes:
      ids: The original ids: int tensor [...], `tf.RaggedTensor` or
        `tf.SparseTensor`.
      unique: int64 [u], the distinct keys in order of first occurrence.
      index: int64 [n], position in `unique` of each flat id.
      counts: int64 [u], occurrences of each unique key.
    """

    ids: Any
    unique: tf.Tensor
    index: tf.Tensor
    counts: tf.Tensor


def flat_keys(ids) -> tf.Tensor:
    """int64 [n] keys of dense / ragged / sparse ids (or of a `PreparedIds`)."""
    if isinstance(ids, PreparedIds):
        ids = ids.ids
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.flat_values
    elif isinstance(ids, tf.SparseTensor):
        ids = ids.values
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise TypeError(f"`ids` must be an integer tensor. Received: ids.dtype={ids.dtype!r}")
    return tf.reshape(tf.cast(ids, tf.int64), [-1])


def prepare_ids(ids) -> PreparedIds:
    """Deduplicates `ids` (one `tf.unique_with_counts`) for a later `sparse_lookup`.

    Args:
      ids: int32/int64 ids: a dense tensor, `tf.RaggedTensor` or `tf.SparseTensor`.

    Returns:
      A `PreparedIds`.

    Raises:
      TypeError: ids are not integers.
    """
    if isinstance(ids, PreparedIds):
        return ids
    unique, index, counts = tf.unique_with_counts(flat_keys(ids), out_idx=tf.int64)
    return PreparedIds(ids, unique, index, counts)


def prepare_keys(
    dataset: tf.data.Dataset,
    features: Sequence[str],
    *,
    num_parallel_calls: int | None = tf.data.AUTOTUNE,
) -> tf.data.Dataset:
    """Maps `prepare_ids` over the named id features of a dataset's batches.

    Apply it after batching and before `prefetch`, so the unique of batch
    `i + 1` runs while the model trains on batch `i`.

    Args:
      dataset: Batches that are a dict of features, or a tuple whose first
        element is that dict (e.g. `(features, labels)`).
      features: Names of the id features to prepare (each looked up by
        `sparse_lookup` / `SparseEmbedding` as a whole).
      num_parallel_calls: For `Dataset.map`.

    Returns:
      The dataset with each named feature replaced by a `PreparedIds`.

    Raises:
      ValueError: a named feature is missing, or the element is not a dict
        (or a tuple starting with one).
    """
    names = list(features)

    def prepare(feats: dict) -> dict:
        if not isinstance(feats, dict):
            raise ValueError(
                "prepare_keys needs dataset elements that are a dict of features "
                f"or a tuple starting with one. Received: {type(feats).__name__}"
            )
        missing = [n for n in names if n not in feats]
        if missing:
            raise ValueError(
                f"prepare_keys: features {missing} are not in the dataset; it has {sorted(feats)}."
            )
        return {k: prepare_ids(v) if k in names else v for k, v in feats.items()}

    def fn(*element):
        if len(element) == 1:
            return prepare(element[0])
        return (prepare(element[0]), *element[1:])

    return dataset.map(fn, num_parallel_calls=num_parallel_calls, deterministic=True)
