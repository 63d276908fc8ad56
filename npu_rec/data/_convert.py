"""Column conventions shared by every source of npu_rec.

- Labels and dense features are float32. An empty dense field becomes
  `DENSE_FILL` (0.0); with `log_dense=True` dense values are mapped through
  `log1p(max(x, 0))`. An empty label is a malformed record.
- Categorical text is hashed to a non-negative int64 with FarmHash64
  (TensorFlow's `tf.strings.to_hash_bucket_fast(x, 2**63 - 1)`): stable across
  runs, machines and versions. Each distinct value of a block is hashed once
  (Arrow dictionary encoding), so the cost follows the number of distinct
  values, not of rows. Integer categorical columns (Parquet, TFRecord) are
  taken as raw ids unchanged (uint64 ids bit for bit: those >= 2**63 become
  negative int64 ids, all distinct).
- An empty (or null) categorical field becomes the reserved id `MISSING_ID` (0).
- Multi-valued fields (`a|b|c`, or Arrow/TFRecord lists) become ragged int64
  ids; empty items are dropped, so an empty field is an empty row.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npu_rec.data._columns import Ragged

MISSING_ID = 0
#: A conventional fill value for densifying padded ids yourself, e.g.
#: `tf.sparse.to_dense(ids, default_value=PAD_ID)`. npu_rec gives it no meaning: -1 is a
#: valid id, looked up like any other. Fixed-shape multi-valued batches
#: (`as_dataset(use_dynamic=False)`) are `tf.SparseTensor`s whose absent entries are the padding.
PAD_ID = -1
DENSE_FILL = 0.0
HASH_BUCKETS = 2**63 - 1


def expand_paths(paths, arg: str = "paths") -> list[str]:
    """Expands a path, a glob pattern or a list of them to existing files, in order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        p = os.fspath(p)
        matches = sorted(glob.glob(p)) if glob.has_magic(p) else [p]
        if not matches or not all(os.path.isfile(m) for m in matches):
            raise FileNotFoundError(f"`{arg}` must name existing files. Received: {arg}={p!r}")
        out.extend(matches)
    if not out:
        raise ValueError(f"`{arg}` must name at least one file. Received: {arg}={paths!r}")
    return out


def check_columns(label, dense, categorical, multi_valued) -> tuple:
    """Validates column roles; returns them as tuples (label, dense, categorical, multi)."""
    if not isinstance(label, str) or not label:
        raise ValueError(f"`label` must be a column name. Received: label={label!r}")
    roles = {"dense": dense, "categorical": categorical, "multi_valued": multi_valued}
    seen = {label: "label"}
    for role, cols in roles.items():
        if isinstance(cols, str):
            raise TypeError(
                f"`{role}` must be a sequence of column names. Received: {role}={cols!r}"
            )
        for c in cols:
            if c in seen:
                raise ValueError(f"Column {c!r} is given twice: as `{seen[c]}` and as `{role}`")
            seen[c] = role
    return label, tuple(dense), tuple(categorical), tuple(multi_valued)


def hash_strings(values) -> np.ndarray:
    """Hashes strings to non-negative int64 ids; empty strings and None to `MISSING_ID`.

    Args:
      values: a sequence, NumPy array or Arrow (chunked) array of `str`.

    Returns:
      int64 NumPy array `[n]`.
    """
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks == 0:
            return np.zeros([0], np.int64)
        return np.concatenate([hash_strings(c) for c in values.chunks])
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.string())
    if len(values) == 0:
        return np.zeros([0], np.int64)
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values)
    uniques = values.dictionary
    table = np.full(len(uniques) + 1, MISSING_ID, np.int64)  # last slot: nulls
    if len(uniques):
        import tensorflow as tf

        text = uniques.to_numpy(zero_copy_only=False)
        hashed = tf.strings.to_hash_bucket_fast(text, HASH_BUCKETS).numpy()
        hashed[text == ""] = MISSING_ID
        table[:-1] = hashed
    idx = values.indices.fill_null(len(uniques)).to_numpy(zero_copy_only=False)
    return table[idx]


def float_column(arr) -> np.ndarray:
    """A numeric Arrow column as float32 `[n]`; nulls become `DENSE_FILL`.

    Values beyond float32's range become +-inf: the sources report non-finite values.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    x = arr.cast(pa.float64()).fill_null(DENSE_FILL).to_numpy(zero_copy_only=False)
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def categorical_column(arr) -> np.ndarray:
    """Text is hashed, integers are raw ids; nulls and "" become `MISSING_ID`. int64 `[n]`."""
    typ = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
    if pa.types.is_integer(typ):
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(typ)
        if typ == pa.uint64():  # bit for bit: ids >= 2**63 become negative, still distinct
            ids = arr.fill_null(MISSING_ID).to_numpy(zero_copy_only=False)
            return ids.astype(np.uint64).view(np.int64)
        return arr.cast(pa.int64()).fill_null(MISSING_ID).to_numpy(zero_copy_only=False)
    return hash_strings(arr)


def multi_valued_column(arr, separator: str = "|") -> Ragged:
    """`a|b` text or list columns as ragged int64 ids (empty items dropped)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        arr = pc.split_pattern(arr.fill_null(""), separator)
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(arr)
    ids = categorical_column(flat)
    if pa.types.is_integer(flat.type):
        keep = ~flat.is_null().to_numpy(zero_copy_only=False)
    else:
        keep = pc.fill_null(pc.not_equal(flat, ""), False).to_numpy(zero_copy_only=False)
    if keep.all():
        return Ragged.from_lengths(ids, lengths)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    return Ragged.from_lengths(ids[keep], np.bincount(rows[keep], minlength=len(lengths)))


def column_streams(label, dense, categorical, multi_valued) -> list:
    """StreamInformation for label, dense, categorical and multi-valued columns, in that order."""
    from npu_rec.data._source import StreamInformation

    specs = [(label, "dense", np.float32, ())]
    specs += [(c, "dense", np.float32, ()) for c in dense]
    specs += [(c, "dense", np.int64, ()) for c in categorical]
    specs += [(c, "ragged", np.int64, (None,)) for c in multi_valued]
    return [StreamInformation(n, i, f, d, s) for i, (n, f, d, s) in enumerate(specs)]


def convert_table(table: pa.Table, roles: tuple, *, separator: str) -> dict:
    """Converts an Arrow table's columns by role (see `check_columns`) to a block.

    Values are not checked here, nor `log_dense` applied: the sources do both for
    every format alike (`RowSource._check_values`).
    """
    label, dense, categorical, multi_valued = roles
    out = {label: float_column(table.column(label))}
    for c in dense:
        out[c] = float_column(table.column(c))
    for c in categorical:
        out[c] = categorical_column(table.column(c))
    for c in multi_valued:
        out[c] = multi_valued_column(table.column(c), separator)
    return out
