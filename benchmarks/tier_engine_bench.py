"""Storage engines for a tiered table's disk tier, on the tier's access pattern.

Each engine holds `--keys` records of one tiered table's record size (88 B:
bfloat16 rows + RowWiseAdagrad at dim 16; 176 B: float32 + Adagrad), keyed
by int64 keys: a bulk load of every record (chunks of 1M), then steps that
do what a training step of a tiered table asks of its disk tier:

  read    the records of `--promotions` distinct cold keys, one batched call
          (the step's promotions), drawn from the tail of a Zipf(`--zipf_a`)
          distribution whose head (`--hot_fraction` of all keys) is in memory;
  delete  those keys (a promoted row lives in memory now);
  write   `--promotions` records of new keys (the step's victims), one batch;
          each takes the place, and the Zipf rank, of a promoted key.

Engines:
  segments        npu_rec's `SegmentStore` (append-only 64 MiB segment files,
                  one pwrite per batch, reads gathered from the segment maps,
                  checksums verified, compaction of segments under a quarter
                  live after each step) with a key -> location index in
                  memory: a NumPy open-addressing hash of 16-byte buckets,
                  like the table's cold index (its bytes per key reported).
  lmdb            LMDB (`lmdb` package): one B+tree, no fsync at commit, no
                  read-ahead; reads by `Cursor.getmulti`, writes by
                  `putmulti`, one transaction per batch.
  rocksdb         RocksDB (`rocksdict` package), default settings (WAL on,
                  the default compression, block cache).
  rocksdb_fbgemm  RocksDB configured as FBGEMM's SSD TBE does: WAL off, no
                  compression, no checksums, no block cache, direct reads and
                  direct flush/compaction I/O, universal compaction, 10-bit
                  Bloom filters. Reads by multi-get, writes by write batches.
  leveldb         LevelDB (`plyvel` package), default settings; per-key gets
                  (its binding has no multi-get).

The key-value engines take big-endian 8-byte keys and the record's bytes as
values, packed in Python: that packing is timed apart (`marshal`), so the
engine columns are the engine's own calls (a C++ caller would pack in place).
Every read is checked: the records returned carry the keys asked for.

Each (size, record, repetition, engine) runs in a child process of its own,
so its RSS growth is its own; the engines alternate within a repetition
(rotated each repetition) and the medians of `--reps` repetitions are
reported, with the load average (1 min) at each run's start. `--cold_steps`
reads per run follow the timed steps, each after the engine's files are
dropped from the page cache (fdatasync + posix_fadvise(DONTNEED), the
maps released first, the key-value stores closed and reopened): cold reads
from the device, `disk MB` being the bytes the process read from storage
(/proc/self/io). Warm figures are page-cache-warm: the data fit in memory.

An engine whose package does not import in this interpreter runs under
`--engine_python` (an interpreter that has it, e.g. a separate virtual
environment: none of these packages is a dependency of npu_rec), or is
skipped with a line saying so. Data directories live under `--data_dir` (a
temporary directory by default) and are removed at the end, also on failure.

Usage:
  python benchmarks/tier_engine_bench.py                       # 1M keys, 88 and 176 B
  python benchmarks/tier_engine_bench.py --keys=10000000 --record_bytes=176 \
      --engine_python=ENV/bin/python
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from _table_ids import raw_keys
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENGINES = ("segments", "lmdb", "rocksdb", "rocksdb_fbgemm", "leveldb")
#: The module each engine needs.
_MODULES = {
    "segments": "npu_rec.table._tier_store",
    "lmdb": "lmdb",
    "rocksdb": "rocksdict",
    "rocksdb_fbgemm": "rocksdict",
    "leveldb": "plyvel",
}
#: Record bytes -> (row dtype, slot widths) at dim 16 (bfloat16 rows stored as their bits).
_LAYOUTS = {88: (np.uint16, [1]), 176: (np.float32, [16])}
_DIM = 16
_CHUNK = 1_000_000

# Run as a script: absl's flags; imported (its tests): flags of its own, so that
# its names cannot clash with another module's in the importing process.
_FV = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_KEYS = flags.DEFINE_list(
    "keys", ["1000000"], "Records per engine (one or more sizes).", flag_values=_FV
)
_RECORD = flags.DEFINE_list(
    "record_bytes",
    ["88", "176"],
    "Record sizes: 88 (bfloat16 + RowWiseAdagrad) and/or 176 (float32 + Adagrad), dim 16.",
    flag_values=_FV,
)
_ENGINES = flags.DEFINE_list("engines", list(ENGINES), f"Engines, of {ENGINES}.", flag_values=_FV)
_PROMOTIONS = flags.DEFINE_integer(
    "promotions",
    12_000,
    "Records read, deleted and written per step.",
    lower_bound=1,
    flag_values=_FV,
)
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per run.", lower_bound=1, flag_values=_FV)
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps first.", lower_bound=0, flag_values=_FV)
_COLD = flags.DEFINE_integer(
    "cold_steps", 3, "Cold-cache reads per run (0: none).", flag_values=_FV
)
_REPS = flags.DEFINE_integer(
    "reps", 3, "Repetitions (medians reported).", lower_bound=1, flag_values=_FV
)
_ZIPF = flags.DEFINE_float(
    "zipf_a", 1.05, "Zipf exponent of the key distribution.", flag_values=_FV
)
_HOT = flags.DEFINE_float(
    "hot_fraction",
    0.2,
    "Share of all keys in memory: reads draw from the Zipf tail after them.",
    flag_values=_FV,
)
_DATA = flags.DEFINE_string(
    "data_dir", None, "Where the engines' files go (default: a temp dir).", flag_values=_FV
)
_PYTHON = flags.DEFINE_string(
    "engine_python",
    None,
    "An interpreter for the engines this one cannot import.",
    flag_values=_FV,
)
_TIMEOUT = flags.DEFINE_integer(
    "run_timeout", 3600, "Seconds one engine's run may take.", flag_values=_FV
)
_JSON = flags.DEFINE_string(
    "json",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tier_engine_bench.json"),
    "Where the results go (the entries of the sizes run replace theirs).",
    flag_values=_FV,
)
_CHILD = flags.DEFINE_string(
    "child", None, "Internal: run this one engine, print its JSON.", flag_values=_FV
)


# ------------------------------------------------------------------ process figures
def _status() -> dict:
    """RSS fields of /proc/self/status, bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out


def _io() -> dict:
    """read_bytes / write_bytes of /proc/self/io (bytes from / to storage)."""
    out = {}
    with contextlib.suppress(OSError), open("/proc/self/io") as f:
        for line in f:
            name, _, value = line.partition(":")
            out[name] = int(value)
    return out


def _disk_bytes(path: str) -> int:
    """Bytes allocated to the files under `path` (sparse files count what they hold)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def _drop_files(path: str) -> None:
    """Flushes the files under `path` and drops their pages from the page cache."""
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    with contextlib.suppress(OSError):
                        os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


# ------------------------------------------------------------------ records
def _record_dtype(record_bytes: int) -> np.dtype:
    from npu_rec.table._tier_store import record_dtype

    row_dtype, widths = _LAYOUTS[record_bytes]
    dtype = record_dtype(_DIM, row_dtype, widths, np.float32)
    assert dtype.itemsize == record_bytes, (dtype.itemsize, record_bytes)
    return dtype


def _records(dtype: np.dtype, keys: np.ndarray, rng) -> np.ndarray:
    """Records of `keys` with random rows and slots (checksum left 0)."""
    n = len(keys)
    recs = np.zeros(n, dtype)
    recs["key"] = keys
    recs["count"] = rng.integers(1, 100, n)
    recs["saved"] = recs["count"]
    recs["last_seen"] = rng.integers(0, 1000, n)
    row = recs["row"]
    if row.dtype == np.uint16:  # bfloat16 bits of small values
        recs["row"] = (rng.uniform(-0.05, 0.05, row.shape).astype(np.float32).view(np.uint32)) >> 16
    else:
        recs["row"] = rng.uniform(-0.05, 0.05, row.shape)
    recs["slots"] = rng.uniform(0, 1, recs["slots"].shape)
    return recs


def _key_bytes(keys: np.ndarray) -> list[bytes]:
    b = keys.astype(">u8").tobytes()
    return [b[i : i + 8] for i in range(0, len(b), 8)]


def _value_bytes(recs: np.ndarray) -> list[bytes]:
    b = recs.tobytes()
    size = recs.dtype.itemsize
    return [b[i : i + size] for i in range(0, len(b), size)]


# ------------------------------------------------------------------ key index
class HashIndex:
    """key -> int64 location, open addressing (linear probing) in two NumPy arrays.

    16 bytes a bucket, a power of two of them below 80% load (the table's
    cold index has the same bucket); batched: one vectorised probe round per
    probe distance. Deleted keys leave tombstones that inserts reuse (a key
    inserted is known to be absent).
    """

    EMPTY, TOMB = -1, -2

    def __init__(self, n: int):
        bits = max(10, int(np.ceil(np.log2(max(n, 1) / 0.8))))
        self.shift = np.uint64(64 - bits)
        self.mask = (1 << bits) - 1
        self.keys = np.full(1 << bits, self.EMPTY, np.int64)
        self.vals = np.zeros(1 << bits, np.int64)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes

    def _home(self, keys: np.ndarray) -> np.ndarray:
        x = keys.astype(np.uint64)  # splitmix64's finalizer, its top bits
        with np.errstate(over="ignore"):
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        return (x >> self.shift).astype(np.int64)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """The bucket of each key (all present)."""
        out = np.empty(len(keys), np.int64)
        idx = np.arange(len(keys))
        pos = self._home(keys)
        while idx.size:
            k = self.keys[pos]
            hit = k == keys[idx]
            out[idx[hit]] = pos[hit]
            if (k == self.EMPTY).any():
                raise KeyError(f"{int((k == self.EMPTY).sum())} keys are not in the index")
            idx, pos = idx[~hit], (pos[~hit] + 1) & self.mask
        return out

    def get(self, keys):
        return self.vals[self.slots(keys)]

    def pop(self, keys):
        at = self.slots(keys)
        vals = self.vals[at]
        self.keys[at] = self.TOMB
        return vals

    def update(self, keys, vals):
        self.vals[self.slots(keys)] = vals

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Inserts distinct keys that are not in the index."""
        idx = np.arange(len(keys))
        pos = self._home(keys)
        while idx.size:
            k = self.keys[pos]
            free = np.nonzero((k == self.EMPTY) | (k == self.TOMB))[0]
            _, first = np.unique(pos[free], return_index=True)
            win = free[first]  # one key per free bucket
            self.keys[pos[win]] = keys[idx[win]]
            self.vals[pos[win]] = vals[idx[win]]
            rest = np.ones(len(idx), bool)
            rest[win] = False
            idx, pos = idx[rest], (pos[rest] + 1) & self.mask


# ------------------------------------------------------------------ engines
class Segments:
    """npu_rec's SegmentStore + a key -> location index in memory."""

    def __init__(self, path, dtype, n):
        from npu_rec.table._tier_store import SegmentStore

        row_dtype, widths = _LAYOUTS[dtype.itemsize]
        self.store = SegmentStore(
            [path], "engine_bench", _DIM, row_dtype, ["s"] * len(widths), np.float32,
            slot_widths=widths,
        )  # fmt: skip
        self.index = HashIndex(n)
        self.compactions = 0

    def _pack(self, recs):
        return self.store.make_records(
            recs["key"], recs["row"], recs["slots"], recs["count"], recs["saved"],
            recs["last_seen"],
        )  # fmt: skip

    def prepare(self, keys, recs):
        return self._pack(recs)  # checksums: part of making the records, not timed

    def write(self, keys, packed):
        self.index.insert(keys, self.store.append(packed))

    def read(self, keys):
        return self.store.read(self.index.get(keys))  # checksums verified

    def delete(self, keys):
        self.store.kill(self.index.pop(keys))

    def maintain(self):
        seg = self.store.compaction_candidate()
        while seg >= 0:
            keys, locs = self.store.relocate(seg)
            self.index.update(keys, locs)
            self.compactions += 1
            seg = self.store.compaction_candidate()

    def drop_cache(self):
        for info in self.store._segments.values():  # the maps' pages first, then the cache's
            info["map"].madvise(mmap.MADV_DONTNEED)
            os.fdatasync(info["fd"])
            os.posix_fadvise(info["fd"], 0, 0, os.POSIX_FADV_DONTNEED)

    def index_bytes(self):
        return self.index.nbytes

    def close(self):
        self.store.close()


class _KeyValue:
    """What the key-value engines share: packed keys and values."""

    marshal_s = 0.0

    def prepare(self, keys, recs):
        t0 = time.perf_counter()
        values = _value_bytes(recs)
        self.marshal_s += time.perf_counter() - t0
        return values

    def _keys(self, keys):
        t0 = time.perf_counter()
        kb = _key_bytes(keys)
        self.marshal_s += time.perf_counter() - t0
        return kb

    def maintain(self):
        pass

    def index_bytes(self):
        return 0


class Lmdb(_KeyValue):
    def __init__(self, path, dtype, n):
        import lmdb

        self.lmdb, self.path = lmdb, path
        self.map_size = max(1 << 30, 4 * n * (dtype.itemsize + 64))
        self._open()

    def _open(self):
        self.env = self.lmdb.open(
            self.path, map_size=self.map_size, sync=False, metasync=False, readahead=False
        )

    def write(self, keys, values):
        kb = self._keys(keys)
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(kb, values, strict=True))

    def read(self, keys):
        kb = self._keys(keys)
        with self.env.begin() as txn:
            got = txn.cursor().getmulti(kb)
        return b"".join(v for _, v in got)

    def delete(self, keys):
        kb = self._keys(keys)
        with self.env.begin(write=True) as txn:
            for k in kb:
                txn.delete(k)

    def drop_cache(self):
        self.env.close()
        _drop_files(self.path)
        self._open()

    def close(self):
        self.env.close()


class Rocks(_KeyValue):
    def __init__(self, path, dtype, n, fbgemm=False):
        import rocksdict

        self.r, self.path, self.fbgemm = rocksdict, path, fbgemm
        self._open()

    def _open(self):
        r = self.r
        opts = r.Options(raw_mode=True)
        opts.create_if_missing(True)
        self.write_opts = r.WriteOptions()
        self.read_opts = r.ReadOptions()
        if self.fbgemm:
            opts.set_compression_type(r.DBCompressionType.none())
            opts.set_compaction_style(r.DBCompactionStyle.universal())
            opts.set_min_write_buffer_number_to_merge(2)
            opts.set_max_write_buffer_number(4)
            opts.set_max_background_jobs(2)
            opts.set_max_open_files(-1)
            opts.set_optimize_filters_for_hits(True)
            opts.set_use_direct_reads(True)
            opts.set_use_direct_io_for_flush_and_compaction(True)
            opts.set_memtable_whole_key_filtering(True)
            table = r.BlockBasedOptions()
            table.disable_cache()
            table.set_bloom_filter(10, False)
            table.set_checksum_type(r.ChecksumType.no_checksum())
            table.set_format_version(5)
            table.set_data_block_index_type(r.DataBlockIndexType.binary_and_hash())
            table.set_data_block_hash_ratio(0.75)
            opts.set_block_based_table_factory(table)
            self.write_opts.disable_wal = True
            self.write_opts.sync = False
            self.read_opts.set_verify_checksums(False)
        self.db = r.Rdict(self.path, options=opts)
        self.db.set_write_options(self.write_opts)
        self.db.set_read_options(self.read_opts)

    def write(self, keys, values):
        kb = self._keys(keys)
        wb = self.r.WriteBatch(raw_mode=True)
        for k, v in zip(kb, values, strict=True):
            wb.put(k, v)
        self.db.write(wb)

    def read(self, keys):
        return b"".join(self.db.get(self._keys(keys)))

    def delete(self, keys):
        wb = self.r.WriteBatch(raw_mode=True)
        for k in self._keys(keys):
            wb.delete(k)
        self.db.write(wb)

    def after_load(self):
        self.db.flush()

    def drop_cache(self):
        self.db.close()
        _drop_files(self.path)
        self._open()

    def close(self):
        self.db.close()


class Level(_KeyValue):
    def __init__(self, path, dtype, n):
        import plyvel

        self.plyvel, self.path = plyvel, path
        self.db = plyvel.DB(path, create_if_missing=True)

    def write(self, keys, values):
        with self.db.write_batch() as wb:
            for k, v in zip(self._keys(keys), values, strict=True):
                wb.put(k, v)

    def read(self, keys):
        get = self.db.get
        return b"".join([get(k) for k in self._keys(keys)])

    def delete(self, keys):
        with self.db.write_batch() as wb:
            for k in self._keys(keys):
                wb.delete(k)

    def drop_cache(self):
        self.db.close()
        _drop_files(self.path)
        self.db = self.plyvel.DB(self.path)

    def close(self):
        self.db.close()


def _make(engine, path, dtype, n):
    if engine == "segments":
        return Segments(path, dtype, n)
    if engine == "lmdb":
        return Lmdb(path, dtype, n)
    if engine in ("rocksdb", "rocksdb_fbgemm"):
        return Rocks(path, dtype, n, fbgemm=engine == "rocksdb_fbgemm")
    return Level(path, dtype, n)


# ------------------------------------------------------------------ the workload
class Keys:
    """The cold keys by Zipf rank; `pick` draws a step's distinct promotions."""

    def __init__(self, n, rng):
        self.n, self.rng = n, rng
        self.keys = raw_keys(np.arange(n))  # loaded in this order
        self.rank_to_pos = rng.permutation(n)  # hot ranks scattered over the files
        self.next = n
        hot = int(n * _HOT.value / max(1e-9, 1 - _HOT.value))
        a = _ZIPF.value
        self.lo, self.hi, self.e = (hot + 1) ** (1 - a), (hot + n + 1) ** (1 - a), 1 / (1 - a)
        self.hot = hot

    def pick(self, count):
        """Positions of `count` distinct cold keys, Zipf tail ranks (in draw order)."""
        got = np.zeros(0, np.int64)
        while len(got) < count:
            u = self.rng.random(2 * count)
            x = np.floor((self.lo + u * (self.hi - self.lo)) ** self.e) - (self.hot + 1)
            ranks = np.concatenate([got, np.clip(x, 0, self.n - 1).astype(np.int64)])
            _, first = np.unique(ranks, return_index=True)
            got = ranks[np.sort(first)]
        return self.rank_to_pos[got[:count]]

    def fresh(self, count):
        out = raw_keys(np.arange(self.next, self.next + count))
        self.next += count
        return out


def _check(out, keys, dtype, what):
    recs = np.frombuffer(out, dtype) if isinstance(out, bytes) else out
    if len(recs) != len(keys) or not np.array_equal(recs["key"], keys):
        raise AssertionError(f"{what}: the records read do not carry the keys asked for")


def _child(engine: str, n: int, record_bytes: int, path: str) -> dict:
    rng = np.random.default_rng(7)
    dtype = _record_dtype(record_bytes)
    keys = Keys(n, rng)
    p = min(_PROMOTIONS.value, max(1, n // 4))
    load0 = os.getloadavg()
    st0 = _status()
    db = _make(engine, path, dtype, n)
    t_load = 0.0
    for start in range(0, n, _CHUNK):
        k = keys.keys[start : start + _CHUNK]
        packed = db.prepare(k, _records(dtype, k, rng))
        t0 = time.perf_counter()
        db.write(k, packed)
        t_load += time.perf_counter() - t0
        del packed
    t0 = time.perf_counter()
    if hasattr(db, "after_load"):
        db.after_load()
    t_load += time.perf_counter() - t0
    db.marshal_s = 0.0
    st_loaded = _status()
    disk_loaded = _disk_bytes(path)
    phases = ("read", "delete", "write", "maintain")
    spent = dict.fromkeys(phases, 0.0)
    io0 = {}
    for step in range(_WARMUP.value + _STEPS.value):
        if step == _WARMUP.value:
            spent = dict.fromkeys(phases, 0.0)
            db.marshal_s = 0.0
            io0 = _io()
        pos = keys.pick(p)
        promoted = keys.keys[pos]
        victims = keys.fresh(p)
        packed = db.prepare(victims, _records(dtype, victims, rng))
        t0 = time.perf_counter()
        out = db.read(promoted)
        t1 = time.perf_counter()
        db.delete(promoted)
        t2 = time.perf_counter()
        db.write(victims, packed)
        t3 = time.perf_counter()
        db.maintain()
        t4 = time.perf_counter()
        for name, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[name] += dt
        _check(out, promoted, dtype, engine)
        keys.keys[pos] = victims
    io1 = _io()
    steps = _STEPS.value
    marshal = db.marshal_s
    st_steps = _status()
    disk_steps = _disk_bytes(path)
    cold_s, cold_read = 0.0, 0
    for _ in range(_COLD.value):
        promoted = keys.keys[keys.pick(p)]
        db.drop_cache()
        before = _io().get("read_bytes", 0)
        t0 = time.perf_counter()
        out = db.read(promoted)
        cold_s += time.perf_counter() - t0
        cold_read += _io().get("read_bytes", 0) - before
        _check(out, promoted, dtype, engine + " (cold)")
    index = db.index_bytes()
    compactions = getattr(db, "compactions", 0)
    db.close()
    ms = {f"{k}_ms": 1e3 * v / steps for k, v in spent.items()}
    step_ms = sum(ms.values())
    return {
        "engine": engine,
        "keys": n,
        "record_bytes": record_bytes,
        "promotions_per_step": p,
        "load_average_at_start": load0,
        "load_average_at_end": os.getloadavg(),
        "load_s": t_load,
        "load_records_per_s": n / t_load,
        **ms,
        "marshal_ms": 1e3 * marshal / steps,
        "step_ms": step_ms,
        "read_records_per_s": p * steps / spent["read"],
        "write_records_per_s": p * steps / spent["write"],
        "cold_read_ms": 1e3 * cold_s / _COLD.value if _COLD.value else None,
        "cold_disk_mb_per_read": cold_read / 1e6 / _COLD.value if _COLD.value else None,
        "disk_mb_read_per_step": (io1.get("read_bytes", 0) - io0.get("read_bytes", 0))
        / 1e6
        / steps,
        "disk_mb_written_per_step": (io1.get("write_bytes", 0) - io0.get("write_bytes", 0))
        / 1e6
        / steps,
        "disk_bytes_per_key_loaded": disk_loaded / n,
        "disk_bytes_per_key_after_steps": disk_steps / n,
        "index_bytes_per_key": index / n,
        "rss_growth_mib_loaded": (st_loaded["VmRSS"] - st0["VmRSS"]) / 2**20,
        "rss_growth_mib": (st_steps["VmRSS"] - st0["VmRSS"]) / 2**20,
        "anon_growth_mib": (st_steps["RssAnon"] - st0["RssAnon"]) / 2**20,
        "peak_rss_mib": st_steps["VmHWM"] / 2**20,
        "compactions": compactions,
    }


# ------------------------------------------------------------------ the parent
def _importable(python: str | None, modules) -> set:
    """The modules of `modules` that import under `python` (None: this interpreter)."""
    if python is None:
        ok = set()
        for m in modules:
            try:
                if importlib.util.find_spec(m) is not None:
                    ok.add(m)
            except ImportError:
                pass
        return ok
    code = (
        "import importlib, sys\n"
        "for m in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(m); print(m)\n"
        "    except Exception:\n"
        "        pass\n"
    )
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    try:
        out = subprocess.run(
            [python, "-c", code, *modules], capture_output=True, text=True, env=env, timeout=120
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(out.split())


def _pythonpath() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)


def _interpreters(engines) -> dict:
    """engine -> the interpreter that runs it; prints a line for each skipped one."""
    modules = {_MODULES[e] for e in engines}
    here = _importable(None, modules)
    there = _importable(_PYTHON.value, modules - here) if _PYTHON.value else set()
    out = {}
    for e in engines:
        if _MODULES[e] in here:
            out[e] = sys.executable
        elif _MODULES[e] in there:
            out[e] = _PYTHON.value
        else:
            where = sys.executable + (f" nor {_PYTHON.value}" if _PYTHON.value else "")
            hint = "" if _PYTHON.value else " (--engine_python: an interpreter that has it)"
            print(f"{e}: skipped, {_MODULES[e]} does not import in {where}{hint}", flush=True)
    return out


def _run_child(python, engine, n, record_bytes, data_dir) -> dict:
    path = tempfile.mkdtemp(prefix=f"{engine}_", dir=data_dir)
    argv = [
        python,
        os.path.abspath(__file__),
        f"--child={engine}",
        f"--keys={n}",
        f"--record_bytes={record_bytes}",
        f"--data_dir={path}",
        f"--promotions={_PROMOTIONS.value}",
        f"--steps={_STEPS.value}",
        f"--warmup={_WARMUP.value}",
        f"--cold_steps={_COLD.value}",
        f"--zipf_a={_ZIPF.value}",
        f"--hot_fraction={_HOT.value}",
    ]
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=_TIMEOUT.value)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if done.returncode:
        raise RuntimeError(f"{engine} ({n} x {record_bytes} B) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_MEDIAN_FIELDS = (
    "load_s", "load_records_per_s", "read_ms", "delete_ms", "write_ms", "maintain_ms",
    "marshal_ms", "step_ms", "read_records_per_s", "write_records_per_s", "cold_read_ms",
    "cold_disk_mb_per_read", "disk_mb_read_per_step", "disk_mb_written_per_step",
    "disk_bytes_per_key_loaded", "disk_bytes_per_key_after_steps", "index_bytes_per_key", "rss_growth_mib_loaded",
    "rss_growth_mib", "anon_growth_mib", "peak_rss_mib",
)  # fmt: skip


def _summary(runs) -> dict:
    out = {"engine": runs[0]["engine"], "runs": len(runs)}
    for f in _MEDIAN_FIELDS:
        vals = [r[f] for r in runs if r.get(f) is not None]
        out[f] = statistics.median(vals) if vals else None
    loads = [r["load_average_at_start"][0] for r in runs]
    out["load_average_1min"] = [min(loads), max(loads)]
    return out


def _print(n, record_bytes, entry):
    rows = entry["median"]
    print(
        f"\n{n} records x {record_bytes} B, {entry['promotions_per_step']} promotions/step, "
        f"medians of {entry['repetitions']}"
    )
    print(
        f"{'engine':15} {'load s':>7} {'read ms':>8} {'del ms':>7} {'write ms':>8} "
        f"{'comp ms':>7} {'step ms':>8} {'marsh ms':>8} {'rd krec/s':>9} {'wr krec/s':>9} "
        f"{'cold ms':>8} {'cold MB':>7} {'disk B/key':>10} {'idx B/key':>9} "
        f"{'RSS+ MiB':>8} {'anon+':>6} {'load avg':>9}"
    )
    for r in rows:
        cold = r["cold_read_ms"]
        cold_mb = r["cold_disk_mb_per_read"]
        print(
            f"{r['engine']:15} {r['load_s']:>7.1f} {r['read_ms']:>8.1f} {r['delete_ms']:>7.1f} "
            f"{r['write_ms']:>8.1f} {r['maintain_ms']:>7.1f} {r['step_ms']:>8.1f} "
            f"{r['marshal_ms']:>8.1f} {r['read_records_per_s'] / 1e3:>9.0f} "
            f"{r['write_records_per_s'] / 1e3:>9.0f} "
            f"{(cold if cold is not None else float('nan')):>8.1f} "
            f"{(cold_mb if cold_mb is not None else float('nan')):>7.1f} "
            f"{r['disk_bytes_per_key_after_steps']:>10.0f} {r['index_bytes_per_key']:>9.1f} "
            f"{r['rss_growth_mib']:>8.0f} {r['anon_growth_mib']:>6.0f} "
            f"{r['load_average_1min'][0]:>4.1f}-{r['load_average_1min'][1]:<4.1f}"
        )


def main(argv):
    del argv
    sizes = [int(k) for k in _KEYS.value]
    records = [int(r) for r in _RECORD.value]
    bad = [e for e in _ENGINES.value if e not in ENGINES]
    if bad or any(r not in _LAYOUTS for r in records) or any(n < 16 for n in sizes):
        raise app.UsageError(
            f"--engines must be of {ENGINES}, --record_bytes of {sorted(_LAYOUTS)}, --keys >= 16. "
            f"Received: engines={_ENGINES.value}, record_bytes={_RECORD.value}, keys={_KEYS.value}"
        )
    if _CHILD.value:
        print(json.dumps(_child(_CHILD.value, sizes[0], records[0], _DATA.value)))
        return
    engines = _interpreters(_ENGINES.value)
    data_dir = tempfile.mkdtemp(prefix="tier_engine_bench_", dir=_DATA.value)
    entries = {}
    try:
        for n in sizes:
            for rb in records:
                runs = {e: [] for e in engines}
                order = list(engines)
                for rep in range(_REPS.value):
                    for e in order[rep % len(order) :] + order[: rep % len(order)]:
                        r = _run_child(engines[e], e, n, rb, data_dir)
                        r["python"] = os.path.basename(os.path.dirname(os.path.dirname(engines[e])))
                        print(
                            f"  rep {rep + 1} {e}: step {r['step_ms']:.1f} ms (read "
                            f"{r['read_ms']:.1f}, write {r['write_ms']:.1f}), load "
                            f"{r['load_s']:.1f} s, load avg {r['load_average_at_start'][0]:.1f}",
                            flush=True,
                        )
                        runs[e].append(r)
                    rows = [_summary(runs[e]) for e in engines]
                    entries[f"{n}x{rb}"] = {
                        "keys": n,
                        "record_bytes": rb,
                        "promotions_per_step": runs[order[0]][0]["promotions_per_step"],
                        "repetitions": rep + 1,
                        "median": rows,
                        "runs": [r for e in engines for r in runs[e]],
                    }
                    _write(entries)  # after each repetition: a cut-short run keeps its figures
                _print(n, rb, entries[f"{n}x{rb}"])
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _write(entries) -> None:
    old = {}
    if os.path.exists(_JSON.value):
        with open(_JSON.value) as f, contextlib.suppress(ValueError):
            old = json.load(f)
    command = " ".join(
        a.split("=")[0] if a.startswith(("--engine_python", "--data_dir", "--json")) else a
        for a in sys.argv
    )
    out = {
        "about": (
            "tier_engine_bench: the disk tier's step (batched read of the promotions, delete "
            "of them, batched write of as many victims) on each storage engine; each entry "
            "NxB = N records of B bytes, medians of the repetitions, every run under runs "
            "(its load average at start and end)."
        ),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "results": {**old.get("results", {}), **entries},
        "commands": {**old.get("commands", {}), **dict.fromkeys(entries, command)},
    }
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    app.run(main)
