"""Ids and memory figures the table benchmarks share (imported by their scripts)."""

import os

import numpy as np

_MUL = np.uint64(0x9E3779B97F4A7C15)


def raw_keys(ranks: np.ndarray) -> np.ndarray:
    """Rank -> a scattered raw 63-bit id (a bijection)."""
    with np.errstate(over="ignore"):
        return ((ranks.astype(np.uint64) * _MUL) >> np.uint64(1)).astype(np.int64)


def rss() -> int:
    """The process's resident bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def zipf_ranks(rng, a: float, n_keys: int, count: int) -> np.ndarray:
    """`count` Zipf(a) ranks folded into [0, n_keys)."""
    return (rng.zipf(a, size=count) - 1) % n_keys
