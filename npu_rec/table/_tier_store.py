"""`SegmentStore`: the disk tier of a tiered table, append-only segment files of fixed-size records.

A tiered table (`npu_rec.table._tier`) keeps its hottest rows in the usual
`RowStorage` and the others here. One record holds everything of one cold
key, written together (docs/design.md "Tiered tables"):

    key int64 | count int64 | saved_count int64 | last_seen int64 | period int64
    | row (row dtype, dim) | slots (slot dtype, the slots' widths summed) | pad
    | checksum uint64

The row's and the slots' storage dtypes and widths are parameters of the
layout (`record_dtype`): a table storing compact rows (bfloat16, float16)
writes their bits as they are, and a slot kept per row (width 1, e.g.
`RowWiseAdagrad`'s accumulator) takes one value, the others `dim` each, one
after the other in the optimizer's slot order. Every record of a table has the same size, so a record is
addressed by its location `segment * records_per_segment + slot`.

Files: `seg-<number>.npr` in `<dir>/<table name>.<pid>.<n>/` (one
directory per store and process), segment `k` in `dirs[k % len(dirs)]`. A segment is preallocated (sparse) to
`records_per_segment` records and filled front to back by one `pwrite` per
demotion batch (sequential); full, it is sealed and the next one opened. A
segment number freed (its file deleted) is taken again by a later segment,
the lowest free one first, so locations stay below the live records plus the
segments' slack however long the table runs: `max_locations` (2**31 where the
cold index holds 32-bit values) bounds them, and an append that would pass it
fails, writing nothing, with an error naming the table and the limit. A number
freed becomes free for reuse only at the next read of the store (the start of
the next step or scan), once the cold index no longer points into it. The
kernel path reads a batch's records with `pread` from the files' descriptors
(`segment_table`, the `NpuRecTierRead` kernel: no map, so the page cache is
not counted in the process's memory); the NumPy path (`read`) gathers them
through a read-only map of each segment, made on its first such read (one
vectorised gather per segment, no call per key); whole-segment scans
(compaction, export, eviction) read the written part of a segment with one
`pread`. Each record carries a
checksum (a 64-bit weighted sum of its 8-byte words, offset so that a zeroed
record fails); a record that fails it raises `SegmentCorruptedError` naming
the file, at the read that meets it (a promotion, an export, a save).

Liveness: a byte per record location (`live`, one array over every
segment number, each segment's `live` a view of its part, so a step's kill of
thousands of scattered locations is one NumPy operation); a promotion or an
eviction clears it, and a segment holding no live record is deleted. A sealed
segment less than a quarter live is compacted: its live records are appended to
the open segment and the file deleted (`compaction_candidate` / `relocate`).

Checkpoints: a sealed segment is never written again (appends go to the
open segment; liveness lives in memory), so a full save hard-links it into
the version's directory (`snapshot`) and copies the open segment's live
records; a restore copies a version's files in (`adopt`). The store's own
directory is the process's: a store deletes its files
when it is closed or collected and at the process's exit, and a new one
deletes the directories of its table left by processes no longer alive
(killed ones).

`period`: a checkpoint save starts a new delta period (`end_period`); a
record written in an earlier period reads with `saved_count = count` (a cold
key is not sighted while it is cold), so no record is rewritten at a save.

Fault injection (tests and `benchmarks/fault_campaign.py` only, never for
production): the environment variable `NPU_REC_TIER_KILL=<point>:<n>` makes
the process SIGKILL itself the `n`-th time (counted over the process's stores)
it reaches `<point>`, one of `KILL_POINTS`: "promotion" (a batch's records
marked dead, their rows not yet in memory), "demotion" (the victims' records
written, their keys not yet moved to `cold_index`), "compaction" (a sparse
segment deleted, its live records not yet rewritten) and "save" (a save's
read of the cold tier). It is read once, when a store is made; unset, a
point costs one attribute test. `NPU_REC_TIER_SEGMENT_BYTES` (same use)
sets `DEFAULT_SEGMENT_BYTES` at import, so a short run seals and compacts
segments.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import heapq
import itertools
import mmap
import os
import re
import shutil
import signal
import weakref

import numpy as np

from npu_rec._paths import fsync_path
from npu_rec._validation import ConfigError as _ConfigError

_CHECK_OFFSET = np.uint64(0x9E3779B97F4A7C15)
_SEGMENT_GLOB_PREFIX = "seg-"
_SEGMENT_SUFFIX = ".npr"
#: Default bytes of one segment file (test-only override: see the module docstring).
DEFAULT_SEGMENT_BYTES = int(os.environ.get("NPU_REC_TIER_SEGMENT_BYTES") or 64 << 20)

#: Test-only fault injection (see the module docstring).
KILL_ENV = "NPU_REC_TIER_KILL"
KILL_POINTS = ("promotion", "demotion", "compaction", "save")
#: Times each point was reached in this process (by stores armed with `KILL_ENV`).
_KILL_SEEN = dict.fromkeys(KILL_POINTS, 0)


def _kill_at() -> tuple[str, int] | None:
    """(point, n) of `KILL_ENV`, or None where it is unset."""
    spec = os.environ.get(KILL_ENV, "")
    if not spec:
        return None
    point, _, n = spec.partition(":")
    if point not in KILL_POINTS or not n.isdigit() or int(n) < 1:
        raise _ConfigError(
            f"The environment variable {KILL_ENV} must be '<point>:<n>' with <point> one of "
            f"{KILL_POINTS} and <n> >= 1 (a test-only fault injection). Received: {spec!r}"
        )
    return point, int(n)


_INSTANCES = itertools.count()
#: Open stores, closed at exit (their files go with the process that wrote them).
_OPEN: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for store in list(_OPEN):
        with contextlib.suppress(Exception):
            store.close()


def _remove_dead(parent: str, name: str) -> None:
    """Deletes `<parent>/<name>.<pid>.<n>` directories of processes no longer alive."""
    if not os.path.isdir(parent):
        return
    pattern = re.compile(re.escape(name) + r"\.(\d+)\.\d+$")
    for entry in os.listdir(parent):
        m = pattern.match(entry)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        except OSError:  # alive, another user's
            pass


class SegmentCorruptedError(RuntimeError):
    """A record of a tiered table's segment file fails its checksum."""


def record_dtype(dim: int, row_dtype, slot_widths, slot_dtype) -> np.dtype:
    """The numpy record layout of a table (see module docstring).

    Args:
      dim: Row width.
      row_dtype: numpy storage dtype of the row (e.g. `ml_dtypes.bfloat16`).
      slot_widths: Width of each slot, in slot order (`dim`, or 1 for a slot
        kept per row).
      slot_dtype: numpy dtype of the slots.
    """
    total = int(sum(slot_widths))
    fields = [
        ("key", "<i8"),
        ("count", "<i8"),
        ("saved", "<i8"),
        ("last_seen", "<i8"),
        ("period", "<i8"),
        ("row", np.dtype(row_dtype), (dim,)),
    ]
    if total:
        fields.append(("slots", np.dtype(slot_dtype), (total,)))
    body = np.dtype(fields).itemsize
    pad = -body % 8
    if pad:
        fields.append(("pad", f"V{pad}"))
    fields.append(("check", "<u8"))
    return np.dtype(fields)


def _weights(words: int) -> np.ndarray:
    rng = np.random.default_rng(0x5E6)
    return rng.integers(0, 2**63, size=words, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


class SegmentStore:
    """The cold records of one table shard (see module docstring).

    Args:
      dirs: Directories; the store uses `<dir>/<name>.<pid>.<n>/` in each.
      name: The shard's name.
      dim: Row width.
      row_dtype, slot_dtype: numpy storage dtypes of the row and the slots.
      slot_names: The optimizer's slot names, in record order.
      segment_bytes: Size of one segment file.
      slot_widths: Width of each slot (default `dim` each).
      max_locations: Locations stay below this (None: no bound); see module
        docstring.
    """

    def __init__(
        self,
        dirs,
        name: str,
        dim: int,
        row_dtype,
        slot_names,
        slot_dtype,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        slot_widths=None,
        max_locations: int | None = None,
    ):
        self._kill_at = _kill_at()  # test-only (see module docstring)
        self.name = name
        self.dim = dim
        self.slot_names = list(slot_names)
        if slot_widths is None:
            slot_widths = [dim] * len(self.slot_names)
        self.slot_widths = [int(w) for w in slot_widths]
        self.dtype = record_dtype(dim, row_dtype, self.slot_widths, slot_dtype)
        self.words = self.dtype.itemsize // 8
        self._w = _weights(self.words - 1)
        self.per_segment = max(1, segment_bytes // self.dtype.itemsize)
        instance = f"{name}.{os.getpid()}.{next(_INSTANCES)}"
        self.dirs = [os.path.join(os.fspath(d), instance) for d in dirs]
        for d in dirs:
            _remove_dead(os.fspath(d), name)
        for d in self.dirs:
            os.makedirs(d)
        _OPEN.add(self)
        self.period = 0
        #: Set around a checkpoint save / restore (`npu_rec.checkpoint._cold`): the
        #: directory a full save puts the live records in, the manifest it made, and
        #: the checkpoint files the next `load` adopts.
        self.snapshot_to: str | None = None
        self.snapshot_manifest: dict | None = None
        self.restore_from: dict | None = None
        self._segments: dict[int, dict] = {}  # number -> {path, fd, map, live, used}
        # Liveness of every location (`segment * per_segment + slot`); a segment's
        # `live` is a view of its part (`_live_of`), re-made when this grows.
        self._live = np.zeros(0, bool)
        self._table = None  # `segment_table()`, until a segment is opened or dropped
        self._next_segment = 0  # the lowest number never used
        self._free: list[int] = []  # numbers free for reuse (a heap)
        self._freed: list[int] = []  # numbers freed since the last read (not yet reusable)
        self.max_locations = max_locations
        self._active = -1
        #: Where the next victim selection's scan starts (`_tier.select_victims`).
        self.hand = 0
        self.stats = {
            "lookups": 0,
            "hits": 0,
            "promotions": 0,
            "demotions": 0,
            "bytes_read": 0,
            "bytes_written": 0,
            "compactions": 0,
            "steps": 0,
        }

    # ------------------------------------------------------------------ files
    def path(self, seg: int) -> str:
        d = self.dirs[seg % len(self.dirs)]
        return os.path.join(d, f"{_SEGMENT_GLOB_PREFIX}{seg:08d}{_SEGMENT_SUFFIX}")

    def _settle(self) -> None:
        """Numbers freed before this read become reusable (the index has followed)."""
        for seg in self._freed:
            heapq.heappush(self._free, seg)
        self._freed.clear()

    def _new_numbers(self, m: int) -> list[int]:
        """The numbers the next `m` new segments take (the lowest free ones first)."""
        free = heapq.nsmallest(m, self._free)
        return free + list(range(self._next_segment, self._next_segment + m - len(free)))

    def _check_room(self, n: int) -> None:
        """Raises, before anything is written, when `n` more records would pass `max_locations`."""
        if self.max_locations is None or not n:
            return
        room = 0
        if self._active >= 0:
            room = self.per_segment - self._segments[self._active]["used"]
        m = -(-(n - room) // self.per_segment) if n > room else 0
        if m and (max(self._new_numbers(m)) + 1) * self.per_segment > self.max_locations:
            live = self.num_live()
            raise _ConfigError(
                f"Tiered table {self.name!r}: its disk tier is full: record locations must stay "
                f"below {self.max_locations} (the cold index holds 32-bit locations: "
                f"{self.max_locations // self.per_segment} segments of {self.per_segment} "
                f"records of {self.dtype.itemsize} bytes per shard), and {n} more records "
                f"do not fit beside the {live} live ones. Split the table into more shards "
                "(`num_shards`) or make its records smaller (a compact `value_dtype`, a "
                "row-wise optimizer slot, a smaller `dim`)."
            )

    def _take_number(self) -> int:
        """The number of a new segment: the lowest free one, else the next never used."""
        if self._free:
            return heapq.heappop(self._free)
        self._next_segment += 1
        return self._next_segment - 1

    def _open_segment(self) -> int:
        seg = self._take_number()
        path = self.path(seg)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        size = self.per_segment * self.dtype.itemsize
        os.ftruncate(fd, size)
        _random_reads(fd)
        self._segments[seg] = {
            "path": path,
            "fd": fd,
            "live": self._live_of(seg),
            "n_live": 0,
            "used": 0,
            "period": -1,
        }
        self._table = None
        self._active = seg
        return seg

    def _live_of(self, seg: int) -> np.ndarray:
        """Segment `seg`'s part of the liveness array, cleared (the array grown to hold it)."""
        p = self.per_segment
        have = len(self._live) // p
        if seg >= have:
            # Grown by an eighth (at least 8 segments): a fill of many segments
            # copies the array a few dozen times, not once per segment.
            grown = np.zeros(max(seg + 1, have + max(8, have // 8)) * p, bool)
            grown[: len(self._live)] = self._live
            self._live = grown
            for g, info in self._segments.items():
                info["live"] = grown[g * p : (g + 1) * p]
        view = self._live[seg * p : (seg + 1) * p]
        view[:] = False
        return view

    def _words(self, info: dict) -> np.ndarray:
        """A segment's records as rows of 8-byte words, through its map (made once; NumPy path)."""
        if "words" not in info:
            mm = mmap.mmap(info["fd"], self.per_segment * self.dtype.itemsize, prot=mmap.PROT_READ)
            # A step reads scattered records: without this, each page fault reads the
            # device's read-ahead window around it (megabytes) once the file has left
            # the page cache.
            mm.madvise(mmap.MADV_RANDOM)
            info["map"] = mm
            # Rows of plain words: a gather of them is a row copy, where one of the
            # structured dtype copies field by field.
            info["words"] = np.frombuffer(mm, dtype=np.uint64).reshape(self.per_segment, self.words)
        return info["words"]

    def segment_table(self):
        """(segment numbers int64 [s] ascending, their descriptors int64 [s], paths bytes [s]).

        What `NpuRecTierRead` reads the records through; valid until a segment
        is opened or dropped (the caller reads before the store changes). The
        kernel path's read of a step: numbers freed before it become reusable.
        """
        self._settle()
        if self._table is None:
            segs = sorted(self._segments)
            self._table = (
                np.array(segs, np.int64),
                np.array([self._segments[g]["fd"] for g in segs], np.int64),
                np.array([self._segments[g]["path"].encode() for g in segs], dtype=object),
            )
        return self._table

    def _drop_segment(self, seg: int) -> None:
        info = self._segments.pop(seg)
        info["live"][:] = False  # its locations are no record's now
        self._table = None
        if "map" in info:
            del info["words"]
            try:
                info["map"].close()
            except BufferError:  # a view is still alive; the map closes with it
                pass
        os.close(info["fd"])
        os.remove(info["path"])
        self._freed.append(seg)
        if seg == self._active:
            self._active = -1

    def close(self) -> None:
        """Deletes the segment files and the store's directories."""
        for seg in list(getattr(self, "_segments", {})):
            self._drop_segment(seg)
        for d in getattr(self, "dirs", []):
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown  # noqa: BLE001
            pass

    def reached(self, point: str) -> None:
        """Test-only: SIGKILLs the process at `KILL_ENV`'s point (see module docstring)."""
        if self._kill_at is None:
            return
        _KILL_SEEN[point] += 1
        if point == self._kill_at[0] and _KILL_SEEN[point] >= self._kill_at[1]:
            os.kill(os.getpid(), signal.SIGKILL)

    # --------------------------------------------------------------- records
    def _checksum(self, recs: np.ndarray) -> np.ndarray:
        words = recs.view(np.uint64).reshape(len(recs), self.words)[:, :-1]
        with np.errstate(over="ignore"):
            s = (words * self._w).sum(axis=1, dtype=np.uint64)
            s ^= s >> np.uint64(29)
            return s + _CHECK_OFFSET

    def make_records(self, keys, rows, slots, counts, saved, last_seen) -> np.ndarray:
        """A record array (checksummed) of `n` keys.

        `rows` [n, dim] in the row dtype (assigned bit for bit); `slots` [n,
        sum of the slot widths] (the slots side by side, in slot order) or None.
        """
        n = len(keys)
        recs = np.zeros(n, self.dtype)
        recs["key"] = keys
        recs["count"] = counts
        recs["saved"] = saved
        recs["last_seen"] = last_seen
        recs["period"] = self.period
        recs["row"] = rows
        if self.slot_names:
            recs["slots"] = np.reshape(slots, (n, recs["slots"].shape[1]))
        recs["check"] = self._checksum(recs)
        return recs

    def split_slots(self, recs: np.ndarray) -> list[np.ndarray]:
        """Each slot of `recs`, [n, width] (copies), in slot order."""
        if not self.slot_names:
            return []
        ends = np.cumsum(self.slot_widths)
        return [
            recs["slots"][:, e - w : e].copy() for e, w in zip(ends, self.slot_widths, strict=True)
        ]

    def append(self, recs: np.ndarray) -> np.ndarray:
        """Writes `recs` at the end of the open segment(s); returns their int64 locations.

        `recs`: a record array, or the records as rows of 8-byte words ([n,
        words] uint64 or int64, as the kernels pack them). The records become
        live once all of them are written: a write that fails (a full disk)
        leaves what it wrote dead space, which compaction reclaims and no save
        copies.
        """
        recs = np.ascontiguousarray(recs)
        self._check_room(len(recs))
        locs = np.empty(len(recs), np.int64)
        runs = []  # (segment info, first slot, records), made live at the end
        done = 0
        while done < len(recs):
            if self._active < 0 or self._segments[self._active]["used"] == self.per_segment:
                self._open_segment()
            info = self._segments[self._active]
            start = info["used"]
            take = min(len(recs) - done, self.per_segment - start)
            # The records' bytes as they are (no copy): `recs` is C-contiguous.
            data = recs[done : done + take].view(np.uint8).reshape(-1)
            written = os.pwrite(info["fd"], data, start * self.dtype.itemsize)
            if written != data.nbytes:
                raise OSError(f"short write to {info['path']!r}: {written} of {data.nbytes} bytes")
            info["used"] = start + take
            runs.append((info, start, take))
            locs[done : done + take] = self._active * self.per_segment + np.arange(
                start, start + take
            )
            done += take
        for info, start, take in runs:
            info["live"][start : start + take] = True
            info["n_live"] += take
            info["period"] = self.period  # the newest period written (delta saves)
        self.stats["bytes_written"] += len(recs) * self.dtype.itemsize
        return locs

    def read(self, locs: np.ndarray, verify: bool = True) -> np.ndarray:
        """The records at `locs` (one gather per segment), checksums verified."""
        self._settle()
        locs = np.asarray(locs, np.int64)
        words = np.empty((len(locs), self.words), np.uint64)
        out = words.view(self.dtype).reshape(-1)
        if not len(locs):
            return out
        segs = locs // self.per_segment
        touched = np.unique(segs)
        for seg in touched:
            info = self._segments.get(int(seg))
            if info is None:
                raise SegmentCorruptedError(
                    f"Tiered table {self.name!r}: segment file {self.path(int(seg))!r} is "
                    "missing but holds live records."
                )
            if len(touched) == 1:
                words[:] = self._words(info)[locs - seg * self.per_segment]
                at = slice(None)
            else:
                at = np.nonzero(segs == seg)[0]
                words[at] = self._words(info)[locs[at] - seg * self.per_segment]
            if verify:
                self._verify(out[at], info["path"])
        self.stats["bytes_read"] += len(locs) * self.dtype.itemsize
        return out

    @property
    def weights(self) -> np.ndarray:
        """The checksum's weights (uint64 bits as int64), one per word but the last."""
        return self._w.view(np.int64)

    def _verify(self, recs: np.ndarray, path: str) -> None:
        bad = self._checksum(recs) != recs["check"]
        if bad.any():
            raise SegmentCorruptedError(
                f"Tiered table {self.name!r}: segment file {path!r} is corrupted: "
                f"{int(bad.sum())} records fail their checksum (e.g. key "
                f"{int(recs['key'][bad][0])}). The table's cold rows cannot be read; "
                "restore the newest checkpoint."
            )

    def saved_counts(self, recs: np.ndarray) -> np.ndarray:
        """`saved` of records, as of the current period (see module docstring)."""
        return np.where(recs["period"] < self.period, recs["count"], recs["saved"])

    def kill(self, locs: np.ndarray) -> None:
        """Marks records dead (promoted or evicted); deletes segments left empty.

        Locations not live (already dead, or of no segment) are left alone.
        """
        locs = np.asarray(locs, np.int64).reshape(-1)
        if not len(locs):
            return
        if locs.min() < 0 or locs.max() >= len(self._live):
            locs = locs[(locs >= 0) & (locs < len(self._live))]
        locs = locs[self._live[locs]]
        if len(locs) > 1:  # a location given twice is counted once
            locs = np.sort(locs)
            locs = locs[np.r_[True, locs[1:] != locs[:-1]]]
        if not len(locs):
            return
        self._live[locs] = False
        segs = locs // self.per_segment  # sorted: a run per segment
        starts = np.r_[0, np.flatnonzero(segs[1:] != segs[:-1]) + 1]
        dead = np.diff(np.r_[starts, len(segs)])
        for seg, n in zip(segs[starts].tolist(), dead.tolist(), strict=True):
            info = self._segments[seg]
            info["n_live"] -= n
            if seg != self._active and not info["n_live"]:
                self._drop_segment(seg)

    def live_records(self):
        """(records, locations) of every live record, checksums verified."""
        self._settle()
        recs, locs = [], []
        for seg, info in sorted(self._segments.items()):
            at = np.nonzero(info["live"][: info["used"]])[0]
            r = self._scan(info)[at]
            self._verify(r, info["path"])
            recs.append(r)
            locs.append(at + seg * self.per_segment)
        if not recs:
            return np.zeros(0, self.dtype), np.zeros(0, np.int64)
        return np.concatenate(recs), np.concatenate(locs)

    def _scan(self, info: dict) -> np.ndarray:
        """The written records of a segment (a copy: one sequential `pread`)."""
        out = np.empty(info["used"], self.dtype)
        buf = out.view(np.uint8).reshape(-1)
        done = 0
        while done < buf.nbytes:
            got = os.preadv(info["fd"], [buf[done:]], done)
            if got <= 0:
                raise SegmentCorruptedError(
                    f"Tiered table {self.name!r}: segment file {info['path']!r} is "
                    f"shorter than its {info['used']} records."
                )
            done += got
        return out

    def changed_records(self, min_period: int) -> np.ndarray:
        """Live records sighted `min_period` (>= 1) times this period, checksums verified.

        Only segments written in the current period are read: a record of an
        earlier period reads as saved at its count (see module docstring).
        """
        out = []
        for _, info in sorted(self._segments.items()):
            if info["period"] < self.period:
                continue
            at = np.nonzero(info["live"][: info["used"]])[0]
            r = self._scan(info)[at].copy()
            self._verify(r, info["path"])
            out.append(r[r["count"] - self.saved_counts(r) >= min_period])
        return np.concatenate(out) if out else np.zeros(0, self.dtype)

    # ------------------------------------------------------ checkpoint files
    def snapshot(self, dest: str) -> dict:
        """Puts the live records into directory `dest` for a checkpoint; returns its manifest.

        A sealed segment (full: never written again; liveness is kept in
        memory) is hard-linked into `dest` (copied where a link fails, e.g.
        another filesystem) after an fsync of its data; the open segment's live
        records are copied (checksums verified). No record is read from a
        sealed segment. The manifest lists, per file: `file`, `records` (in
        the file), `live` (a bool array per record; the caller stores it) and
        `linked`; plus the store's layout and `period`.
        """
        os.makedirs(dest, exist_ok=True)
        files, copied, linked = [], 0, 0
        todo = [info for _, info in sorted(self._segments.items()) if info["n_live"]]
        for i, info in enumerate(todo):
            if i == len(todo) // 2:
                self.reached("save")  # test-only: some files of the save are in place
            used = info["used"]
            name = os.path.basename(info["path"])
            target = os.path.join(dest, name)
            if used == self.per_segment:  # sealed
                if not info.get("synced"):
                    os.fsync(info["fd"])
                    info["synced"] = True
                copied += link_or_copy(info["path"], target)
                linked += 1
                files.append(
                    {"file": name, "records": used, "live": info["live"].copy(), "linked": True}
                )
            else:
                at = np.nonzero(info["live"][:used])[0]
                recs = self._scan(info)[at].copy()
                self._verify(recs, info["path"])
                write_records(target, recs)
                copied += recs.nbytes
                files.append(
                    {
                        "file": name,
                        "records": len(at),
                        "live": np.ones(len(at), bool),
                        "linked": False,
                    }
                )
        if not todo:
            self.reached("save")
        fsync_path(dest)
        self.stats["snapshot_bytes_copied"] = self.stats.get("snapshot_bytes_copied", 0) + copied
        return {
            "files": files,
            "period": self.period,
            "per_segment": self.per_segment,
            "bytes_copied": copied,
            "files_linked": linked,
        }

    def adopt(self, path: str, src_dtype: np.dtype, records: int, live, gone, shard_of=None):
        """Takes a checkpoint's cold file into the store; returns (keys, locations) of its records.

        `live`: bool [records], the file's live records; `gone`: sorted int64
        keys to leave out (deleted or rewritten by later deltas); `shard_of`:
        None, or a function keys -> bool [n] (the keys this shard holds). A
        sealed segment of this store's layout whose records all belong here is
        copied whole (one sequential copy; not linked, so that damage to the
        running table's files cannot reach the checkpoint) and kept as a sealed
        segment; otherwise its live records are converted and appended. Records are read a
        file at a time and their checksums verified.

        Raises:
          SegmentCorruptedError: a record fails its checksum (naming the file).
        """
        src_dtype = np.dtype(src_dtype)
        size = os.path.getsize(path)
        if size < records * src_dtype.itemsize:
            raise SegmentCorruptedError(
                f"Tiered table {self.name!r}: checkpoint segment file {path!r} is corrupted: "
                f"{size} bytes, expected at least {records * src_dtype.itemsize}."
            )
        live = np.asarray(live, bool)[:records]
        whole = (
            src_dtype == self.dtype
            and records == self.per_segment
            and size == self.per_segment * self.dtype.itemsize
            and shard_of is None
            and (
                self.max_locations is None
                or (self._new_numbers(1)[0] + 1) * self.per_segment <= self.max_locations
            )
        )
        if whole:
            seg = self._take_number()
            dest = self.path(seg)
            # Copied, not linked: the running table's files never share bytes with
            # the version it started from, so damage to them cannot reach it.
            shutil.copyfile(path, dest)
            fd = os.open(dest, os.O_RDONLY)
            _random_reads(fd)
            info = {
                "path": dest,
                "fd": fd,
                "live": self._live_of(seg),
                "n_live": 0,
                "used": self.per_segment,
                "period": -1,
            }
            self._table = None
            self._segments[seg] = info
            at = np.nonzero(live)[0]
            recs = self._scan(info)[at]
            self._verify(recs, dest)
            keys = recs["key"].copy()
            keep = ~_isin_sorted(keys, gone)
            at, keys = at[keep], keys[keep]
            info["live"][at] = True
            info["n_live"] = len(at)
            if not len(at):
                self._drop_segment(seg)
            return keys, at + seg * self.per_segment
        recs = np.fromfile(path, dtype=src_dtype, count=records)[live]
        self._verify_as(recs, src_dtype, path)
        keep = ~_isin_sorted(recs["key"], gone)
        if shard_of is not None:
            keep &= shard_of(recs["key"])
        recs = recs[keep]
        if src_dtype != self.dtype:
            recs = self._convert(recs)
        else:
            recs = recs.copy()
            recs["saved"] = recs["count"]
            recs["period"] = self.period
            recs["check"] = self._checksum(recs)
        return recs["key"].copy(), self.append(recs)

    def _verify_as(self, recs: np.ndarray, dtype: np.dtype, path: str) -> None:
        """`_verify` of records in another layout (same checksum over its words)."""
        if dtype == self.dtype:
            self._verify(recs, path)
            return
        words = recs.view(np.uint64).reshape(len(recs), dtype.itemsize // 8)[:, :-1]
        with np.errstate(over="ignore"):
            s = (words * _weights(words.shape[1])).sum(axis=1, dtype=np.uint64)
            s ^= s >> np.uint64(29)
            s += _CHECK_OFFSET
        bad = s != recs["check"]
        if bad.any():
            raise SegmentCorruptedError(
                f"Tiered table {self.name!r}: segment file {path!r} is corrupted: "
                f"{int(bad.sum())} records fail their checksum."
            )

    def _convert(self, recs: np.ndarray) -> np.ndarray:
        """Records of another row/slot dtype in this store's layout (rounded to nearest)."""
        slots = recs["slots"] if self.slot_names else None
        if slots is not None:
            slots = slots.astype(self.dtype["slots"].base)
        return self.make_records(
            recs["key"],
            recs["row"].astype(self.dtype["row"].base),
            slots,
            recs["count"],
            recs["count"],
            recs["last_seen"],
        )

    def num_live(self) -> int:
        return int(sum(i["n_live"] for i in self._segments.values()))

    def disk_bytes(self) -> int:
        """Bytes of the records written in the segment files (live or dead)."""
        return sum(i["used"] for i in self._segments.values()) * self.dtype.itemsize

    def reset(self) -> None:
        """Drops every segment (the cold tier becomes empty; the cold index is reset after)."""
        for seg in list(self._segments):
            self._drop_segment(seg)
        self._next_segment, self._free, self._freed = 0, [], []
        self._live = np.zeros(0, bool)

    def ram_bytes(self) -> int:
        """Bytes of memory the store keeps beside the index: its liveness array (a byte a location)."""
        return len(self._live)

    # ------------------------------------------------------------ compaction
    def compaction_candidate(self) -> int:
        """A sealed segment less than a quarter live, or -1."""
        for seg, info in self._segments.items():
            if seg != self._active and 4 * info["n_live"] < info["used"]:
                return seg
        return -1

    def relocate(self, seg: int):
        """Copies segment `seg`'s live records to the open segment and deletes it.

        Returns:
          (keys int64 [k], new locations int64 [k]).
        """
        info = self._segments[seg]
        at = np.nonzero(info["live"][: info["used"]])[0]
        recs = self._scan(info)[at]
        self._verify(recs, info["path"])
        self._check_room(len(recs))  # before the segment goes
        self._drop_segment(seg)
        self.reached("compaction")  # the live records only in memory now
        if self._active < 0:
            self._open_segment()
        locs = self.append(recs)
        self.stats["compactions"] += 1
        return recs["key"].copy(), locs


def _random_reads(fd: int) -> None:
    """Tells the kernel a segment is read a record here and there: a read that misses
    the page cache fetches its own pages only, not a read-ahead window around them
    (which would also push other records out of the cache). Its reads leave the
    file's access time alone (`O_NOATIME`, allowed on the process's own files): a
    step reads thousands of records, each read would otherwise check it."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    if hasattr(os, "O_NOATIME"):
        with contextlib.suppress(OSError):  # not the owner (EPERM): reads as before
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME)


def _isin_sorted(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """bool [n]: which of `keys` are in sorted `sorted_keys`."""
    if not len(sorted_keys):
        return np.zeros(len(keys), bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def link_or_copy(src: str, dest: str) -> int:
    """Hard-links `src` to `dest`, or copies it (fsynced) where a link fails; returns bytes copied."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(dest)
    try:
        os.link(src, dest)
        return 0
    except OSError:  # another filesystem, or links not supported
        shutil.copyfile(src, dest)
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return os.path.getsize(dest)


def write_records(path: str, recs: np.ndarray) -> None:
    """Writes `recs` to a new file `path`, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = np.ascontiguousarray(recs).view(np.uint8).reshape(-1)
        done = 0
        while done < data.nbytes:
            done += os.write(fd, data[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_file(path: str, dtype: np.dtype, records: int, live=None) -> str | None:
    """Why the `records` records of a segment file fail (None: they pass), a segment at a time.

    Reads the file in chunks (bounded memory). `live`: bool [records] or None
    (every record); only those are checked.
    """
    dtype = np.dtype(dtype)
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if size < records * dtype.itemsize:
        return f"truncated: {size} bytes, expected at least {records * dtype.itemsize}"
    words = dtype.itemsize // 8
    w = _weights(words - 1)
    chunk = max(1, (64 << 20) // dtype.itemsize)
    with open(path, "rb") as f:
        for start in range(0, records, chunk):
            n = min(chunk, records - start)
            raw = np.fromfile(f, dtype=np.uint64, count=n * words)
            if raw.size != n * words:
                return "truncated while reading records"
            raw = raw.reshape(n, words)
            if live is not None:
                raw = raw[np.asarray(live[start : start + n], bool)]
            with np.errstate(over="ignore"):
                s = (raw[:, :-1] * w).sum(axis=1, dtype=np.uint64)
                s ^= s >> np.uint64(29)
                s += _CHECK_OFFSET
            bad = s != raw[:, -1]
            if bad.any():
                return f"{int(bad.sum())} records fail their checksum"
    return None


def check_dirs(paths) -> tuple[str, ...]:
    """`ssd_path` as a tuple of directory names (validated; see `TableConfig`)."""
    rule = "`ssd_path` must be a directory name or a non-empty list of them"
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not paths:
        raise _ConfigError(f"{rule}. Received: ssd_path={paths!r}")
    out = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)) or not os.fspath(p):
            raise _ConfigError(f"{rule}. Received: ssd_path={paths!r}")
        p = os.fspath(p)
        if os.path.exists(p) and not os.path.isdir(p):
            raise _ConfigError(f"{rule}; {p!r} is a file. Received: ssd_path={paths!r}")
        out.append(p)
    if len(set(out)) != len(out):
        raise _ConfigError(f"{rule}, each named once. Received: ssd_path={paths!r}")
    return tuple(out)
