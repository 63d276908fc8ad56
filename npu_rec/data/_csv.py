"""Reading CSV/TSV click logs (Criteo, Avazu, MovieLens) into NumPy columns.

Conventions, the same for every source of npu_rec:
- Categorical values are hashed from their text form to a non-negative
  int64 with FarmHash64 (TensorFlow's `tf.strings.to_hash_bucket_fast`,
  modulo 2**63 - 1): stable across runs, machines and versions.
- An empty categorical field becomes the reserved id `MISSING_ID` (0).
- An empty dense field becomes `DENSE_FILL` (0.0); with `log_dense=True`
  dense values are mapped through `log1p(max(x, 0))`.
- Multi-valued fields (`a|b|c`) become a `tf.RaggedTensor` of hashed ids;
  an empty one is an empty row.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

MISSING_ID = 0
DENSE_FILL = 0.0
_HASH_BUCKETS = 2**63 - 1

SAMPLES_DIR = os.path.join(os.path.dirname(__file__), "samples")

# The shipped samples: file name and column roles.
SAMPLES = {
    "criteo_sample": dict(
        file="criteo_sample.txt",
        label="label",
        dense=tuple(f"I{i}" for i in range(1, 14)),
        categorical=tuple(f"C{i}" for i in range(1, 27)),
    ),
    "avazu_sample": dict(
        file="avazu_sample.txt",
        label="click",
        dense=(),
        categorical=(
            "hour",
            "C1",
            "banner_pos",
            "site_id",
            "site_domain",
            "site_category",
            "app_id",
            "app_domain",
            "app_category",
            "device_id",
            "device_ip",
            "device_model",
            "device_type",
            "device_conn_type",
            "C14",
            "C15",
            "C16",
            "C17",
            "C18",
            "C19",
            "C20",
            "C21",
        ),
    ),
    "movielens_sample": dict(
        file="movielens_sample.txt",
        label="rating",
        dense=(),
        categorical=("user_id", "movie_id", "gender", "age", "occupation", "zip"),
        multi_valued=("genres",),
    ),
}


def hash_strings(values) -> np.ndarray:
    """Hashes strings to non-negative int64 ids; empty strings to `MISSING_ID`.

    Args:
      values: a sequence, NumPy array or Arrow array of `str`/`bytes`; None
        counts as empty.

    Returns:
      int64 NumPy array of the same length.
    """
    import tensorflow as tf

    arr = pa.array(values, type=pa.string()) if not isinstance(values, pa.Array) else values
    arr = arr.fill_null("")
    text = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=object)
    if len(text) == 0:
        return np.zeros([0], np.int64)
    ids = tf.strings.to_hash_bucket_fast(text.astype(str), _HASH_BUCKETS).numpy()
    ids[text == ""] = MISSING_ID
    return ids.astype(np.int64)


def read_csv(
    path: str,
    *,
    label: str,
    dense=(),
    categorical=(),
    multi_valued=(),
    delimiter: str = ",",
    header: bool = True,
    column_names=None,
    log_dense: bool = False,
) -> dict:
    """Reads a whole (small) CSV file into columns.

    Args:
      path: the file.
      label: the label column (float32 `[n]` in the result).
      dense: dense columns (float32 `[n]`, empty -> `DENSE_FILL`).
      categorical: categorical columns (int64 `[n]`, hashed, empty -> 0).
      multi_valued: `|`-separated columns (`tf.RaggedTensor` int64 `[n, None]`).
      delimiter: field separator.
      header: whether the first line names the columns; without it,
        `column_names` must give them.
      column_names: column names of a file without a header.
      log_dense: map dense values through `log1p(max(x, 0))`.

    Returns:
      A dict from column name to array, for `label` and every listed column.

    Raises:
      ValueError: a listed column is missing from the file (names the file,
        the column and the columns found).
    """
    import tensorflow as tf

    if not header and column_names is None:
        raise ValueError(f"`column_names` is required when header=False. Received: path={path!r}")
    wanted = (label, *dense, *categorical, *multi_valued)
    read_opts = pacsv.ReadOptions(column_names=None if header else list(column_names))
    parse_opts = pacsv.ParseOptions(delimiter=delimiter)
    types = {c: pa.string() for c in (*categorical, *multi_valued)}
    types.update({c: pa.float64() for c in (label, *dense)})
    convert = pacsv.ConvertOptions(
        column_types=types, include_columns=list(wanted), strings_can_be_null=False
    )
    try:
        table = pacsv.read_csv(path, read_opts, parse_opts, convert)
    except (pa.ArrowInvalid, KeyError) as err:
        raise ValueError(f"Cannot read {path!r}: {err}") from err
    out = {}
    for name in (label, *dense):
        col = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        col = np.where(np.isnan(col), DENSE_FILL, col)
        if log_dense and name != label:
            col = np.log1p(np.maximum(col, 0.0))
        out[name] = col.astype(np.float32)
    for name in categorical:
        out[name] = hash_strings(table.column(name).combine_chunks())
    for name in multi_valued:
        rows = table.column(name).to_pylist()
        parts = [[v for v in (r or "").split("|") if v] for r in rows]
        flat = hash_strings([v for p in parts for v in p])
        out[name] = tf.RaggedTensor.from_row_lengths(flat, [len(p) for p in parts])
    return out


def load_sample(name: str, **kwargs) -> dict:
    """Reads one of the shipped real samples (see `SAMPLES`) into columns.

    Args:
      name: "criteo_sample", "avazu_sample" or "movielens_sample".
      **kwargs: passed to `read_csv` (e.g. `log_dense=True`).
    """
    if name not in SAMPLES:
        raise ValueError(f"`name` must be one of {sorted(SAMPLES)}. Received: name={name!r}")
    spec = dict(SAMPLES[name])
    path = os.path.join(SAMPLES_DIR, spec.pop("file"))
    return read_csv(path, **spec, **kwargs)
