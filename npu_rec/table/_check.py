"""The invariant check a table runs before its state is saved.

A single-shard table (`SingleShardTable`) keeps one state in three places: the
row storage (`counts`, `row_keys`, values, slots, free list), the allocator
counters (`next_row - num_free`, i.e. `size()`) and the key index. Before
every save (`SparseTable.save`, `TableCheckpointManager.save`, a Keras
`.keras` file) `SingleShardTable.read_state` computes, in the same graph run
as the state it reads:

* live rows (`counts > 0`) == `size()` == keys held by the index (the
  kernel's count and the held buckets);
* no row on the free list is live;
* every indexed key is found again by a lookup at its own row (so no key is
  held twice: a lookup returns the first of two copies) and its row is
  live and maps back to it (`row_keys[row] == key`);
* every live row's values and optimizer slots are finite, and so is every
  row and slot of the table's trained fallback (`not_admitted="hashed"`,
  `verify_fallback`: all its rows are in use).

Together these make the index a bijection between the live keys and live
rows. A failure raises `TableInvariantError` naming the table and the broken
invariant, before anything is written, so the previous checkpoint stays the
newest. Cost: docs/design.md "Invariant check".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf


class TableInvariantError(RuntimeError):
    """A sparse table's state is inconsistent or non-finite; it was not saved."""


def build_check(table) -> dict[str, tf.Tensor]:
    """Scalar tensors measuring `table`'s invariants (one shard; see module docstring)."""
    s, index = table.storage, table.key_index
    counts = s.counts.read_value()
    live = counts > 0
    mixed, rows = index.held_mixed()
    cap = s.capacity()
    in_range = (rows >= 0) & (rows < cap)
    safe = tf.where(in_range, rows, tf.zeros_like(rows))
    keys = index.unmix(mixed)
    maps_back = (
        in_range & tf.gather(live, safe) & tf.equal(tf.gather(s.row_keys.read_value(), safe), keys)
    )
    found = tf.equal(index.lookup_mixed(mixed), rows)
    num_free = s.num_free.read_value()
    free = s.free.read_value()[:num_free]
    out = {
        "live_rows": tf.math.count_nonzero(live),
        "size": s.live_count(),
        "index_size": index.size(),
        "index_held": tf.size(rows, out_type=tf.int64),
        "unmapped": tf.math.count_nonzero(~maps_back),
        "unmapped_key": _first(keys, ~maps_back),
        "not_found": tf.math.count_nonzero(~found),
        "not_found_key": _first(keys, ~found),
        "free_live": tf.math.count_nonzero(tf.gather(counts, free) > 0),
    }
    for name, var in [("values", s.values), *[(f"slot/{n}", v) for n, v in s.slots.items()]]:
        bad = tf.reduce_any(~tf.math.is_finite(var.read_value()), axis=1) & live
        out[f"nonfinite/{name}"] = tf.math.count_nonzero(bad)
        out[f"nonfinite_key/{name}"] = _first(s.row_keys.read_value(), bad)
    return out


def _first(keys: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """int64 scalar: the first of `keys` where `mask`, or 0."""
    picked = tf.boolean_mask(keys, mask)
    return tf.cond(tf.size(picked) > 0, lambda: picked[0], lambda: tf.constant(0, tf.int64))


def _repeated_key(keys: np.ndarray):
    """A key found twice in sorted `keys`, or None."""
    keys = np.asarray(keys)
    same = keys[1:] == keys[:-1]
    return int(keys[1:][same][0]) if same.any() else None


def _raise_inconsistent(table_name: str, problems: list[str]):
    raise TableInvariantError(
        f"Sparse table {table_name!r} is inconsistent, so its state is not saved (the "
        f"previous checkpoint is kept): {'; '.join(problems)}. This is a bug in npu_rec; "
        "please report it."
    )


def verify_unique_keys(table_name: str, keys: np.ndarray) -> None:
    """Raises `TableInvariantError` if sorted `keys` hold a key twice."""
    twice = _repeated_key(keys)
    if twice is not None:
        _raise_inconsistent(table_name, [f"key {twice} has two live rows"])


def verify(table_name: str, check: dict[str, Any], keys: np.ndarray) -> None:
    """Raises `TableInvariantError` unless `check` (from `build_check`, as numpy) holds.

    Args:
      table_name: For the message.
      check: The evaluated `build_check` tensors.
      keys: int64 [n], the live keys read with the state, sorted.
    """
    c = {k: int(v) for k, v in check.items()}
    problems = []
    if not c["live_rows"] == c["size"] == c["index_size"] == c["index_held"]:
        problems.append(
            f"live rows ({c['live_rows']}) == size() ({c['size']}) == keys in the index "
            f"({c['index_size']} counted, {c['index_held']} held) does not hold"
        )
    if c["free_live"]:
        problems.append(f"{c['free_live']} rows on the free list are live")
    if c["not_found"]:
        problems.append(
            f"{c['not_found']} indexed keys are held twice or cannot be found "
            f"again (e.g. key {c['not_found_key']})"
        )
    if c["unmapped"]:
        problems.append(
            f"{c['unmapped']} indexed keys point to a row that is free or holds "
            f"another key (e.g. key {c['unmapped_key']})"
        )
    twice = _repeated_key(keys)
    if twice is not None:
        problems.append(f"key {twice} has two live rows")
    if problems:
        _raise_inconsistent(table_name, problems)
    nonfinite = [
        (name[len("nonfinite/") :], n)
        for name, n in c.items()
        if name.startswith("nonfinite/") and n
    ]
    if nonfinite:
        where = ", ".join(
            f"{n} live rows of `{name}` (e.g. key {c['nonfinite_key/' + name]})"
            for name, n in nonfinite
        )
        raise TableInvariantError(
            f"Sparse table {table_name!r} holds NaN or Inf in {where}, so its state is not "
            "saved (the previous checkpoint is kept): every live row's values and slots "
            "must be finite. Training diverged: lower the learning rate, clip gradients, "
            "or look for non-finite input values."
        )


def verify_fallback(table_name: str, arrays: dict[str, Any], prefix: str) -> None:
    """Raises `TableInvariantError` unless the fallback's rows and slots are finite.

    Args:
      table_name: For the message.
      arrays: The fallback's entries of a state (`<prefix>values`, `<prefix>slot/<name>`).
      prefix: Of those entries.
    """
    where = []
    for key, value in arrays.items():
        if key == f"{prefix}step":
            continue
        bad = ~np.all(np.isfinite(np.asarray(value, np.float32)), axis=1)
        if bad.any():
            name = key[len(prefix) :]
            where.append(f"{int(bad.sum())} rows of `{name}` (e.g. bucket {int(np.argmax(bad))})")
    if where:
        raise TableInvariantError(
            f"Sparse table {table_name!r} holds NaN or Inf in its trained fallback "
            f"(not_admitted='hashed'): {', '.join(where)}, so its state is not saved (the "
            "previous checkpoint is kept): every fallback row's values and slots must be "
            "finite. Training diverged: lower the learning rate, clip gradients, or look "
            "for non-finite input values."
        )
