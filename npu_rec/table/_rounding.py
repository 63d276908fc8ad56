"""Row storage dtypes and the stochastic rounding of compact rows.

A table's rows are stored in its `value_dtype`: float32 (the default),
bfloat16 or float16. Optimizer slots stay float32, lookups hand out float32,
and an optimizer step computes in float32; only the write of the new rows
rounds them to the storage dtype. Rounding to nearest would lose every update
smaller than half a unit in the last place (bfloat16 keeps 8 significant
bits), so the optimizer's writes round *stochastically*: up with probability
equal to the distance from the value below, which makes the stored value an
unbiased estimate of the float32 result. The random bits are a hash, so a run
is reproducible: the same (table seed, key, step) rounds the same way in
eager mode, in a graph, on any shard and on both table backends.

The rounding of float32 `x`, element `e` (0-based column) of the row of
`key`, at update `step` (the table's 1-based update count) of a table with
seed `seed`, is exactly:

1. `r = splitmix64(splitmix64(splitmix64((key ^ seed ^ SALT)) + step) + e)`
   in uint64 wrap-around arithmetic (`splitmix64(z)` is the SplitMix64 output
   function of `z`: `z += 0x9E3779B97F4A7C15`, then the two xor-shift-multiply
   rounds with 0xBF58476D1CE4E5B9 and 0x94D049BB133111EB and a final
   `z ^= z >> 31`; `key` is the int64 key's two's-complement bits, `SALT` =
   0xD1B54A32D192ED03), and `u = r >> 32`, 32 random bits.
2. `d` = the float32 mantissa bits the storage dtype drops: 16 for bfloat16,
   13 for float16.
3. With `b` the float32 bit pattern of `x` (uint32): unless `x` is Inf or
   NaN, `b = (b + (u >> (32 - d))) & ~(2**d - 1)`: the top `d` bits of `u`
   are added below the kept mantissa bits (a carry rounds the magnitude up),
   then the dropped bits are cleared.
4. The float32 of the bit pattern `b` is converted to the storage dtype with
   round-to-nearest-even, which is exact for bfloat16 and for float16 between
   2**-14 and 65504. Below 2**-14 (float16's subnormals) that conversion
   rounds once more to nearest, so float16 rounding is unbiased only above
   2**-14 (the bias below is under 2**-25); magnitudes that round above 65504
   become Inf in float16 (as rounding to nearest would).

Rows that are not an optimizer step's result round to nearest: initial rows
of admitted keys, and rows restored from a checkpoint of another value dtype.
`tests/table/test_table_compact.py` checks both backends against a NumPy
implementation of these four steps, bit for bit.
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._validation import ConfigError
from npu_rec.table._keyed_init import _splitmix64

#: Salt of the rounding hash (keeps it apart from the keyed initialiser's).
SALT = 0xD1B54A32D192ED03

#: Storage dtype -> float32 mantissa bits it drops.
DROPPED_BITS = {tf.bfloat16: 16, tf.float16: 13}

_NAMES = {"float32": tf.float32, "bfloat16": tf.bfloat16, "float16": tf.float16}


def check_value_dtype(value) -> tf.DType:
    """The `tf.DType` of a `value_dtype` argument (a dtype or its name).

    Raises:
      ConfigError: not float32, bfloat16 or float16.
    """
    dtype = None
    if isinstance(value, str):
        dtype = _NAMES.get(value)
    elif not isinstance(value, bool):
        try:
            dtype = tf.as_dtype(value)
        except TypeError:
            dtype = None
    if dtype not in (tf.float32, tf.bfloat16, tf.float16):
        raise ConfigError(
            "`value_dtype` must be tf.float32, tf.bfloat16 or tf.float16 (or their names "
            f'"float32", "bfloat16", "float16"). Received: value_dtype={value!r}'
        )
    return dtype


def random_bits(keys: tf.Tensor, step: tf.Tensor, dim: int, seed: int) -> tf.Tensor:
    """uint64 [n, dim]: `u` of step 1 above (32 random bits) for rows of `keys` at `step`."""
    u = tf.uint64
    k = tf.bitcast(tf.cast(keys, tf.int64), u)
    base = _splitmix64(tf.bitwise.bitwise_xor(k, tf.constant(seed ^ SALT, u)))
    s = tf.bitcast(tf.cast(tf.reshape(step, []), tf.int64), u)
    row = _splitmix64(base + s)
    cols = tf.bitcast(tf.range(dim, dtype=tf.int64), u)
    r = _splitmix64(row[:, None] + cols[None, :])
    return tf.bitwise.right_shift(r, tf.constant(32, u))


def stochastic_round(
    x: tf.Tensor, keys: tf.Tensor, step: tf.Tensor, seed: int, dtype: tf.DType
) -> tf.Tensor:
    """float32 [n, dim] `x` rounded to `dtype` (see module docstring); `dtype` [n, dim]."""
    if dtype == tf.float32:
        return x
    d = DROPPED_BITS[dtype]
    u64 = tf.uint64
    x = tf.convert_to_tensor(x, tf.float32)
    bits = tf.cast(tf.bitcast(x, tf.uint32), u64)
    noise = tf.bitwise.right_shift(
        random_bits(keys, step, x.shape[-1] or tf.shape(x)[-1], seed), tf.constant(32 - d, u64)
    )
    mask = tf.constant(0xFFFFFFFF ^ ((1 << d) - 1), u64)
    rounded = tf.bitwise.bitwise_and(bits + noise, mask)
    finite = tf.not_equal(
        tf.bitwise.bitwise_and(bits, tf.constant(0x7F800000, u64)), tf.constant(0x7F800000, u64)
    )
    bits = tf.where(finite, rounded, bits)
    return tf.cast(tf.bitcast(tf.cast(bits, tf.uint32), tf.float32), dtype)


class RoundedRows:
    """The rows variable of a compact table as an optimizer step writes it.

    `SparseOptimizer.apply_sparse` gets this in place of the rows variable: it
    reads the touched rows (`sparse_read`, float32; `tf.gather` of it reads
    the whole table as float32) and writes new float32 rows with
    `scatter_update`, which rounds them stochastically for (seed, the rows'
    keys, `step`).

    Args:
      storage: The shard's `RowStorage`.
      seed: The table's seed.
      step: int64 scalar, the update's 1-based count.
    """

    def __init__(self, storage, seed: int, step: tf.Tensor):
        self.storage = storage
        self.variable = storage.values
        self.seed = seed
        self.step = step
        self.dtype = tf.float32
        self.shape = storage.values.shape

    def sparse_read(self, rows: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.gather(self.variable, rows), tf.float32)

    def scatter_update(self, sparse_delta: tf.IndexedSlices) -> tf.Operation:
        rows = sparse_delta.indices
        keys = tf.gather(self.storage.row_keys, rows)
        stored = stochastic_round(
            sparse_delta.values, keys, self.step, self.seed, self.variable.dtype
        )
        return self.variable.scatter_update(tf.IndexedSlices(stored, rows))


def _as_float32(value: RoundedRows, dtype=None, name=None, as_ref=False):
    del name, as_ref
    if dtype is not None and dtype != tf.float32:
        return NotImplemented
    return tf.cast(value.variable.read_value(), tf.float32)


tf.register_tensor_conversion_function(RoundedRows, _as_float32)
