"""A dict-based NumPy model of a sparse table, for property tests.

Deliberately naive: one Python dict entry per key, loops over keys, float32
NumPy arithmetic. It defines the behaviour the real table must match.
"""

from __future__ import annotations

import copy
import zlib

import ml_dtypes  # TensorFlow's NumPy bfloat16
import numpy as np

_M64 = (1 << 64) - 1


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _shard(key: int, num_shards: int) -> int:
    """The shard of `key`: (splitmix64(key) >> 32) mod num_shards."""
    return (_splitmix(key & _M64) >> 32) % num_shards


def keyed_uniform(key: int, dim: int, name: str, scale: float = 0.05) -> np.ndarray:
    """Initial row of `key` in table `name` (same definition as npu_rec)."""
    seed = zlib.crc32(name.encode("utf-8"))
    base = _splitmix((key & _M64) ^ seed)
    out = np.empty(dim, np.float32)
    for j in range(dim):
        unit = np.float32(_splitmix((base + j) & _M64) >> 40) * np.float32(1.0 / (1 << 24))
        out[j] = (unit * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)
    return out


_SALT = 0xD1B54A32D192ED03
#: float32 mantissa bits each compact storage dtype drops.
_DROPPED = {"bfloat16": 16, "float16": 13}


def _splitmix_np(z: np.ndarray) -> np.ndarray:
    """SplitMix64 output function on a uint64 array (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def stochastic_round(x, keys, step: int, seed: int, dtype: str) -> np.ndarray:
    """float32 [n, dim] `x` rounded to `dtype` as npu_rec's compact rows define it.

    `r = splitmix64(splitmix64(splitmix64(key ^ seed ^ SALT) + step) + element)`,
    `u = r >> 32`; the top `d` bits of `u` (d = 16 for bfloat16, 13 for float16)
    are added to the float32 bit pattern, the low `d` bits are cleared (Inf and
    NaN kept), and the result is converted to `dtype` to nearest. Returns the
    rounded values as float32 (exactly representable in `dtype`).
    """
    x = np.asarray(x, np.float32)
    n, dim = x.shape
    k = np.asarray(keys, np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        base = _splitmix_np(k ^ np.uint64(seed ^ _SALT))
        row = _splitmix_np(base + np.uint64(step))
        r = _splitmix_np(row[:, None] + np.arange(dim, dtype=np.uint64)[None, :])
    u = r >> np.uint64(32)
    d = _DROPPED[dtype]
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + (u >> np.uint64(32 - d))) & np.uint64(0xFFFFFFFF ^ ((1 << d) - 1))
    finite = (bits & np.uint64(0x7F800000)) != np.uint64(0x7F800000)
    out = np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)
    target = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    return out.astype(target).astype(np.float32)


def nearest(x, dtype: str) -> np.ndarray:
    """float32 `x` rounded to nearest in `dtype` ("float32" keeps it), as float32."""
    if dtype == "float32":
        return np.asarray(x, np.float32)
    target = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    return np.asarray(x, np.float32).astype(target).astype(np.float32)


class RefOptimizer:
    """Per-row optimizer math (float32). `kind` in sgd/adagrad/rowwise_adagrad/adam/ftrl."""

    def __init__(self, kind: str, **hp):
        self.kind, self.hp = kind, hp

    def slots(self, dim):
        f = np.full
        if self.kind == "adagrad":
            return {"accumulator": f(dim, self.hp["initial_accumulator_value"], np.float32)}
        if self.kind == "rowwise_adagrad":
            return {"accumulator": f(1, self.hp["initial_accumulator_value"], np.float32)}
        if self.kind == "adam":
            return {"m": np.zeros(dim, np.float32), "v": np.zeros(dim, np.float32)}
        if self.kind == "ftrl":
            return {
                "accumulator": f(dim, self.hp["initial_accumulator_value"], np.float32),
                "linear": np.zeros(dim, np.float32),
            }
        return {}

    def update(self, row, g, t):
        hp, f32 = self.hp, np.float32
        lr = f32(hp["learning_rate"])
        if self.kind == "sgd":
            row["value"] = row["value"] - lr * g
        elif self.kind == "adagrad":
            acc = row["slots"]["accumulator"] + g * g
            row["slots"]["accumulator"] = acc
            row["value"] = row["value"] - lr * g / (np.sqrt(acc) + f32(hp["epsilon"]))
        elif self.kind == "rowwise_adagrad":
            squares = g * g
            total = squares[0]
            for d in range(1, len(g)):  # summed in element order
                total = total + squares[d]
            acc = row["slots"]["accumulator"] + total / np.float32(len(g))
            row["slots"]["accumulator"] = acc
            row["value"] = row["value"] - lr * g / (np.sqrt(acc) + f32(hp["epsilon"]))
        elif self.kind == "adam":
            b1, b2 = f32(hp["beta_1"]), f32(hp["beta_2"])
            s = row["slots"]
            s["m"] = b1 * s["m"] + (f32(1) - b1) * g
            s["v"] = b2 * s["v"] + (f32(1) - b2) * g * g
            lr_t = lr * np.sqrt(f32(1) - b2 ** f32(t)) / (f32(1) - b1 ** f32(t))
            row["value"] = row["value"] - lr_t * s["m"] / (np.sqrt(s["v"]) + f32(hp["epsilon"]))
        elif self.kind == "ftrl":
            s, p = row["slots"], f32(-hp["learning_rate_power"])
            acc_new = s["accumulator"] + g * g
            lin = s["linear"] + g - (acc_new**p - s["accumulator"] ** p) / lr * row["value"]
            quad = acc_new**p / lr + f32(2 * hp["l2"])
            l1 = f32(hp["l1"])
            row["value"] = ((np.clip(lin, -l1, l1) - lin) / quad).astype(np.float32)
            s["accumulator"], s["linear"] = acc_new, lin


class ReferenceTable:
    """The table semantics of npu_rec, written out key by key."""

    def __init__(
        self,
        name,
        dim,
        optimizer=None,
        access_threshold=-1,
        eviction_threshold=-1,
        max_pending_keys=1 << 20,
        num_shards=1,
        value_dtype="float32",
    ):
        self.name, self.dim, self.opt = name, dim, optimizer
        #: Storage dtype of the rows: values are kept as float32 representable in it.
        self.value_dtype = value_dtype
        self.seed = zlib.crc32(name.encode("utf-8"))
        # Each shard bounds (and prunes) its own pending counters.
        self.num_shards = num_shards
        if num_shards > 1:
            max_pending_keys = max(2, -(-max_pending_keys // num_shards))
        self.access, self.evict_after, self.max_pending = (
            access_threshold,
            eviction_threshold,
            max_pending_keys,
        )
        self.rows: dict[int, dict] = {}
        self.pending: dict[int, list] = {}
        self.deleted: set[int] = set()
        self.max_seen, self.opt_step = 0, 0

    def lookup(self, ids, times, training=True):
        """ids, times: int sequences of equal length. Returns float32 [n, dim]."""
        ids = [int(k) for k in ids]
        if training:
            counts, newest = {}, {}
            for k, t in zip(ids, times, strict=True):
                counts[k] = counts.get(k, 0) + 1
                newest[k] = max(newest.get(k, int(t)), int(t))
            for k, c in counts.items():
                t = newest[k]
                if k in self.rows:
                    r = self.rows[k]
                    r["count"] += c
                    r["period"] += c
                    r["last"] = max(r["last"], t)
                    continue
                total, prior_last = c, 0
                if self.access > 0:
                    prior = self.pending.get(k, [0, 0])
                    total, prior_last = prior[0] + c, prior[1]
                    if total < self.access:
                        self.pending[k] = [total, max(prior_last, t)]
                        continue
                    self.pending.pop(k, None)
                self.rows[k] = {
                    "value": nearest(keyed_uniform(k, self.dim, self.name), self.value_dtype),
                    "slots": self.opt.slots(self.dim) if self.opt else {},
                    "count": total,
                    "period": total,
                    "last": max(0, t),
                }
            for s in range(self.num_shards):
                group = [k for k in self.pending if _shard(k, self.num_shards) == s]
                if len(group) > self.max_pending:
                    order = sorted(group, key=lambda k: (-self.pending[k][1], k))
                    for k in order[self.max_pending // 2 :]:
                        del self.pending[k]
            self.max_seen = max([self.max_seen, 0, *[int(t) for t in times]])
        zero = np.zeros(self.dim, np.float32)
        return np.stack(
            [self.rows[k]["value"].copy() if k in self.rows else zero for k in ids]
        ).reshape(len(ids), self.dim)

    def apply(self, ids, grads):
        summed = {}
        for k, g in zip(ids, np.asarray(grads, np.float32), strict=True):
            summed[int(k)] = summed.get(int(k), np.zeros(self.dim, np.float32)) + g
        self.opt_step += 1
        for k, g in summed.items():
            if k in self.rows:
                self.opt.update(self.rows[k], g, self.opt_step)
                if self.value_dtype != "float32":
                    value = self.rows[k]["value"][None, :]
                    self.rows[k]["value"] = stochastic_round(
                        value, [k], self.opt_step, self.seed, self.value_dtype
                    )[0]

    def evict(self, now):
        if self.evict_after < 0:
            return 0
        gone = [k for k, r in self.rows.items() if now - r["last"] > self.evict_after]
        for k in gone:
            del self.rows[k]
            self.deleted.add(k)
        for k in [k for k, p in self.pending.items() if now - p[1] > self.evict_after]:
            del self.pending[k]
        return len(gone)

    def end_period(self):
        for r in self.rows.values():
            r["period"] = 0
        self.deleted.clear()

    def snapshot(self):
        return copy.deepcopy((self.rows, self.pending, self.max_seen, self.opt_step))

    def load(self, snap):
        self.rows, self.pending, self.max_seen, self.opt_step = copy.deepcopy(snap)
        self.end_period()

    def export(self):
        keys = sorted(self.rows)
        slot_names = list(self.opt.slots(1)) if self.opt else []
        return {
            "keys": np.array(keys, np.int64),
            "values": np.array([self.rows[k]["value"] for k in keys], np.float32).reshape(
                -1, self.dim
            ),
            "counts": np.array([self.rows[k]["count"] for k in keys], np.int64),
            "last_seen": np.array([self.rows[k]["last"] for k in keys], np.int64),
            "slots": {
                n: np.array([self.rows[k]["slots"][n] for k in keys], np.float32).reshape(
                    -1, self.opt.slots(self.dim)[n].size
                )
                for n in slot_names
            },
            "pending": {k: tuple(v) for k, v in self.pending.items()},
        }
