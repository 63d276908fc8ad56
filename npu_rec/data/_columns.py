"""Blocks of columns: NumPy arrays, or `Ragged` (values + row splits) for multi-valued ones."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Ragged:
    """A multi-valued column: row `i` is `values[splits[i]:splits[i + 1]]`."""

    values: np.ndarray  # int64 [total]
    splits: np.ndarray  # int64 [n + 1], starting at 0

    def __len__(self) -> int:
        return len(self.splits) - 1

    def slice(self, lo: int, hi: int) -> Ragged:
        a, z = self.splits[lo], self.splits[hi]
        return Ragged(self.values[a:z], self.splits[lo : hi + 1] - a)

    @staticmethod
    def from_lengths(values: np.ndarray, lengths: np.ndarray) -> Ragged:
        splits = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        return Ragged(np.asarray(values, np.int64), splits)


def slice_columns(cols: dict, lo: int, hi: int) -> dict:
    return {k: (v.slice(lo, hi) if isinstance(v, Ragged) else v[lo:hi]) for k, v in cols.items()}


def take_rows(cols: dict, keep: np.ndarray) -> dict:
    """Rows where the boolean mask `keep` is True."""
    out = {}
    for k, v in cols.items():
        if isinstance(v, Ragged):
            lengths = np.diff(v.splits)
            per_value = np.repeat(keep, lengths)
            out[k] = Ragged.from_lengths(v.values[per_value], lengths[keep])
        else:
            out[k] = v[keep]
    return out


def concat_columns(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k, first in parts[0].items():
        if isinstance(first, Ragged):
            values = np.concatenate([p[k].values for p in parts])
            lengths = np.concatenate([np.diff(p[k].splits) for p in parts])
            out[k] = Ragged.from_lengths(values, lengths)
        else:
            out[k] = np.concatenate([p[k] for p in parts])
    return out


def empty_like(streams) -> dict:
    out = {}
    for s in streams:
        if s.storage_format == "ragged":
            out[s.name] = Ragged(np.zeros([0], np.int64), np.zeros([1], np.int64))
        else:
            out[s.name] = np.zeros([0], s.dtype)
    return out


def to_output(col):
    """NumPy arrays as they are; `Ragged` as an int64 `tf.RaggedTensor` `[n, None]`."""
    if isinstance(col, Ragged):
        import tensorflow as tf

        return tf.RaggedTensor.from_row_splits(col.values, col.splits, validate=False)
    return col
