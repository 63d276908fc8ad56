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


def bounded_zipf_ranks(rng, a: float, n_keys: int, count: int) -> np.ndarray:
    """`count` ranks in [0, n_keys) with P(rank r) proportional to (r + 1) ** -a.

    Exact sampling of Zipf's law on a finite catalogue by rejection-inversion
    (the integral of x ** -a inverted, a draw kept unless it falls in the gap
    between the continuous and the discrete mass; few are redrawn). Unlike
    `zipf_ranks`, no mass beyond `n_keys` folds back: with a = 1.05 and 50M
    keys, the unbounded law puts about 35% of its draws past the catalogue,
    and folding spreads them uniformly over every key.
    """
    if a <= 0 or a == 1.0:
        raise ValueError(f"a: must be positive and not 1, got {a}")
    q = 1.0 - a

    def h(x):
        return np.power(x, q) / q

    def h_inv(y):
        return np.power(y * q, 1.0 / q)

    lo, hi = h(1.5) - 1.0, h(n_keys + 0.5)
    s = 2.0 - h_inv(h(2.5) - 2.0**-a)
    out = np.empty(count, np.int64)
    todo = np.arange(count)
    while len(todo):
        u = hi + rng.random(len(todo)) * (lo - hi)
        x = h_inv(u)
        k = np.clip(np.floor(x + 0.5), 1, n_keys)
        ok = (k - x <= s) | (u >= h(k + 0.5) - np.power(k, -a))
        out[todo[ok]] = k[ok].astype(np.int64) - 1
        todo = todo[~ok]
    return out
