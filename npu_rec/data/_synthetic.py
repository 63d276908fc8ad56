"""A generator of Criteo-shaped click data with a planted, learnable signal.

Every row is a pure function of `(seed, row index)`: rows are generated in
fixed blocks of `BLOCK_ROWS`, each from its own random stream, so any range of
rows can be produced in any order (for worker sharding and for resuming at a
checkpointed position) and is identical every time.

Row layout (Criteo's): `label` (int32 0/1), `I1`..`I13` (float32 dense
counts, >= 0), `C1`..`C26` (raw int64 ids). Ids follow a truncated power law
(Zipf-like, exponent `alpha`) over each feature's vocabulary; a rank is mapped
to a raw 64-bit id by a fixed bijective mix, so ids look like hashed feature
values (spread over the whole int64 range) and never collide across features.

The label is Bernoulli(sigmoid(logit)) where the logit sums a hidden weight
per (feature, id) pair, linear terms in log1p of some dense features, and one
pairwise interaction, so a model that learns embeddings beats one that does
not. `probabilities=True` returns the true click probability of each row (the
Bayes-optimal predictor) for tests and sanity checks.
"""

from __future__ import annotations

import dataclasses

import numpy as np

NUM_DENSE = 13
NUM_CATEGORICAL = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
BLOCK_ROWS = 4096

# Vocabulary sizes shaped like Criteo's (a few tiny, most medium, a few huge),
# scaled down so that a small model learns the signal in a few thousand steps.
DEFAULT_VOCAB_SIZES = (
    1000,
    500,
    100_000,
    50_000,
    300,
    20,
    10_000,
    600,
    3,
    50_000,
    5_000,
    100_000,
    3_000,
    25,
    10_000,
    100_000,
    10,
    4_000,
    2_000,
    4,
    100_000,
    15,
    15,
    50_000,
    80,
    40_000,
)

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection on uint64 with good avalanche."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _unit(x: np.ndarray) -> np.ndarray:
    """Maps uint64 hashes to floats uniform in [-1, 1)."""
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 52) - 1.0


@dataclasses.dataclass(frozen=True)
class SyntheticCriteo:
    """Deterministic Criteo-shaped rows with a planted signal.

    Args:
      seed: selects the data set: rows, ids and the hidden signal.
      vocab_sizes: distinct ids per categorical feature (26 entries).
      alpha: the power-law exponent of id frequencies (> 0, != 1).
      signal: overall strength of the planted signal (0 gives labels that no
        model can predict).

    Example:
      >>> gen = SyntheticCriteo(seed=7)
      >>> rows = gen.rows(0, 1000)
      >>> rows["C1"].dtype, rows["I1"].shape, rows["label"].mean() < 0.5
      (dtype('int64'), (1000,), True)
    """

    seed: int = 0
    vocab_sizes: tuple[int, ...] = DEFAULT_VOCAB_SIZES
    alpha: float = 1.05
    signal: float = 1.0

    def __post_init__(self):
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"`seed` must be an integer. Received: seed={self.seed!r}")
        if len(self.vocab_sizes) != NUM_CATEGORICAL or min(self.vocab_sizes) < 1:
            raise ValueError(
                f"`vocab_sizes` must be {NUM_CATEGORICAL} integers >= 1. "
                f"Received: vocab_sizes={self.vocab_sizes!r}"
            )
        if not self.alpha > 0 or self.alpha == 1:
            raise ValueError(f"`alpha` must be > 0 and != 1. Received: alpha={self.alpha!r}")
        object.__setattr__(self, "vocab_sizes", tuple(int(v) for v in self.vocab_sizes))

    # -- public -------------------------------------------------------------

    @property
    def column_names(self) -> tuple[str, ...]:
        return ("label", *DENSE_NAMES, *CATEGORICAL_NAMES)

    def rows(self, start: int, stop: int, *, probabilities: bool = False) -> dict:
        """Returns rows `[start, stop)` as a dict of column name to NumPy array.

        Args:
          start: index of the first row (>= 0).
          stop: one past the last row (>= start).
          probabilities: also return `"probability"`, the true click
            probability of each row (float64, shape `[n]`).

        Returns:
          `{"label": int32 [n], "I1".."I13": float32 [n], "C1".."C26": int64 [n]}`.
        """
        if start < 0 or stop < start:
            raise ValueError(
                f"rows() needs 0 <= start <= stop. Received: start={start}, stop={stop}"
            )
        parts = []
        first_block, last_block = start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS
        for block in range(first_block, last_block + 1 if stop > start else first_block):
            data = self._block(block)
            lo = max(start - block * BLOCK_ROWS, 0)
            hi = min(stop - block * BLOCK_ROWS, BLOCK_ROWS)
            parts.append({k: v[lo:hi] for k, v in data.items()})
        if not parts:
            parts.append({k: v[:0] for k, v in self._block(0).items()})
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if not probabilities:
            del out["probability"]
        return out

    def feature_id(self, feature: int, rank: np.ndarray) -> np.ndarray:
        """The raw int64 id of the `rank`-th most frequent value of a feature."""
        key = (np.uint64(feature + 1) << np.uint64(56)) ^ rank.astype(np.uint64)
        return _mix64(key ^ np.uint64(self.seed & 0xFFFFFFFF)).view(np.int64)

    # -- internals ----------------------------------------------------------

    def _weights(self, feature: int, ids: np.ndarray) -> np.ndarray:
        salt = np.uint64((self.seed * 1_000_003 + feature * 7919 + 1) & 0xFFFFFFFFFFFF)
        return _unit(_mix64(ids.view(np.uint64) ^ salt))

    def _block(self, block: int) -> dict:
        rng = np.random.default_rng([self.seed, block])
        n = BLOCK_ROWS
        out = {}
        logit = np.full(n, -1.3)
        # Dense counts: heavy-tailed and non-negative, like Criteo's.
        dense = np.floor(rng.lognormal(mean=1.0, sigma=1.5, size=(NUM_DENSE, n)))
        dense_w = _unit(_mix64(np.arange(NUM_DENSE, dtype=np.uint64) + np.uint64(self.seed)))
        for j, name in enumerate(DENSE_NAMES):
            out[name] = dense[j].astype(np.float32)
            if j < 6:
                logit += 0.25 * self.signal * dense_w[j] * (np.log1p(dense[j]) - 1.2)
        one_minus_a = 1.0 - self.alpha
        ids_by_feature = []
        for f, (name, vocab) in enumerate(zip(CATEGORICAL_NAMES, self.vocab_sizes, strict=True)):
            u = rng.random(n)
            # Inverse CDF of a continuous power law on [1, vocab + 1).
            hi = (vocab + 1.0) ** one_minus_a
            rank = np.floor((1.0 + u * (hi - 1.0)) ** (1.0 / one_minus_a)) - 1.0
            rank = np.clip(rank, 0, vocab - 1).astype(np.int64)
            ids = self.feature_id(f, rank)
            ids_by_feature.append(ids)
            out[name] = ids
            # Small vocabularies carry the strongest per-id signal.
            strength = 0.9 if vocab <= 1000 else 0.5
            logit += self.signal * strength * self._weights(f, ids)
        # One pairwise interaction (what FM/DeepFM layers are for).
        logit += (
            0.8
            * self.signal
            * self._weights(40, ids_by_feature[0])
            * self._weights(41, ids_by_feature[1])
        )
        prob = 1.0 / (1.0 + np.exp(-logit))
        out["label"] = (rng.random(n) < prob).astype(np.int32)
        out["probability"] = prob
        return out
