"""Tiered tables: the hottest `memory_rows` rows in memory, the others on disk.

`create_table(..., memory_rows=N, ssd_path=...)` gives a table whose shards
use a tiered backend (`TieredStockBackend` or `TieredKernelBackend`: the
stock or the kernel backend with the tier on top, so both lookup paths work).
The in-memory tier is the usual shard state (`RowStorage`, key index,
pending counters); the disk tier is a `SegmentStore` (`_tier_store`: records
of key, row, slots, count, last-seen and checksum in append-only segment
files) and a second key index, `cold_index`, mapping each cold key to its
record's location: on the kernel path npu_rec's own map with 12-byte buckets
and 32-bit locations (the store reuses freed segment numbers, so locations
stay below 2**31 while a shard's records fit), sized exactly (`COLD_MAX_LOAD`,
`COLD_GROWTH`: at most 12 * 1.4 / 0.85 = 19.8 B per cold key); on the stock
path a `DenseHashTable` (16 B per bucket, a power of two below 80% load).

Every training lookup first runs `prepare` on the batch's unique keys (in the
shard's lock, before the in-memory lookup, which then runs unchanged):

1. the batch's keys without a row in memory are probed in `cold_index`;
2. if the memory rows plus those keys would pass `memory_rows`, that many
   victims are demoted (`select_victims`): rows with an old last-seen time
   (ties: the fewest sightings), found by a CLOCK-like hand that scans the
   rows from where it stopped for rows under a bound taken from a sample (a
   small table, or many victims: the exact oldest), never a row of a key
   looked up since the last optimizer step (its gradient is still to come);
   their records are written by one sequential append and their keys move
   to `cold_index`;
3. the batch's cold keys are promoted: one batched read, rows allocated and
   written back exactly as they were (values, slots, counts, saved counts,
   last-seen), keys moved to the in-memory index;
4. a sealed segment less than a quarter live is compacted (its live records are
   rewritten at the end of the log and `cold_index` follows them);
5. both indexes are rebuilt when their tombstones crowd them.

Rows move between the tiers in their storage dtype (`value_dtype`: float32,
bfloat16 or float16) and slots at their own widths (`dim`, or 1 for a slot
kept per row), bits unchanged: no float32 round trip on the way to or from
disk. A promotion or a demotion changes no exported value: `export()` of a tiered
table equals that of an in-memory table fed the same batches (tested in
tests/table/test_tier.py). `memory_rows` is a bound on the rows kept between
steps: while one step's keys (those of the batch and of earlier lookups not
yet followed by an optimizer step) need more rows, memory holds them.

Whole-table operations see both tiers: `size` (in memory + cold keys),
`evict` (idle keys of either tier; a dead record's space returns through
compaction), `export` (in-memory rows, then the live records), `load` (the
hottest `memory_rows` rows by last-seen and count into memory, the rest into
a fresh log), `end_period` (a period counter; see `_tier_store`).
A checkpoint manager's full save sets the store's `snapshot_to`: `export`
then returns the memory rows only and the store links its sealed segments
into the version (`SegmentStore.snapshot`); a restore sets `restore_from`:
`load` copies those files into the store and rebuilds `cold_index` from
their records (`npu_rec.checkpoint._cold`). A tiered checkpoint restores into
an in-memory table and the reverse.

Inference lookups read cold rows from disk without promoting them;
`find_rows` (`apply_gradients` of ids not looked up) promotes.

Limits: the optimizer (its slots) must be known when the table is made; the
store lives in the process that builds the table's ops (its bookkeeping runs in
`tf.numpy_function`): a worker of a multi-worker strategy tiers its own shard,
but a shard on a parameter server cannot be tiered (`create_table` refuses it).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from npu_rec._kernels import _ops
from npu_rec._kernels._key_map import KeyMap
from npu_rec._validation import ConfigError
from npu_rec.table import _lookup, _tier_store
from npu_rec.table._base import NO_NOW
from npu_rec.table._fused import KernelBackend
from npu_rec.table._key_index import KeyIndex
from npu_rec.table._state import ShardState
from npu_rec.table._stock import StockBackend
from npu_rec.table._storage import decode_seen, encode_seen, saturated

#: `cold_index` on the kernel path (npu_rec's map): it grows when the cold keys
#: would pass this share of its buckets, by `COLD_GROWTH`, to an exact size, so
#: it holds between 12 / 0.85 = 14.1 and 12 * 1.4 / 0.85 = 19.8 bytes per cold key.
COLD_MAX_LOAD = 0.85
COLD_GROWTH = 1.4
#: Keys the kernel path's `cold_index` is first allocated for.
COLD_START_KEYS = 1 << 12
#: Record locations on the kernel path stay below this (the map's int32 values).
COLD_MAX_LOCATIONS = 2**31


@dataclasses.dataclass(eq=False)
class TierState(ShardState):
    """A `ShardState` with the disk tier (see module docstring).

    Attributes:
      cold_index: Cold key -> record location.
      store: The shard's `SegmentStore`.
      protected: int64 [p] keys looked up since the last optimizer step.
      protected_step: int64 scalar, the optimizer step `protected` belongs to.
      memory_rows: The shard's bound on rows kept in memory.
    """

    cold_index: KeyIndex | None = None
    store: _tier_store.SegmentStore | None = None
    protected: tf.Variable | None = None
    protected_step: tf.Variable | None = None
    memory_rows: int = 0

    def variables(self) -> list[tf.Variable]:
        """The shard's variables, the tier's included (table state, not dense model state)."""
        cold = self.cold_index
        return [
            *super().variables(),
            cold.removed,
            cold.reserved_rows,
            self.protected,
            self.protected_step,
        ]


#: The row an inference lookup reports for a cold key: not a row in memory (it is read
#: from disk without promotion), but >= 0, so the key is not taken for one without a row
#: (whose fallback row `not_admitted="hashed"` fills in); a sharded table's `row * S + s`
#: stays >= 0 up to 2**22 shards or workers.
COLD_ROW = 1 << 40


def _np_dtype(dtype: tf.DType):
    return dtype.as_numpy_dtype


#: Victim selection (`select_victims`, `NpuRecTierVictims`): rows sampled for
#: the bound, and about how many times the victims' number pass it.
_SAMPLE = 4096
_SPREAD = 16


def select_victims(counts, seen, held, k, hand):
    """The rows to demote and where the next selection starts (the NumPy reference).

    The kernel path's `NpuRecTierVictims` chooses the same rows. A row is
    eligible when live (`counts > 0`) and not in `held`; its score is
    `seen + 1 - 1 / (1 + count)` (older first, then fewer sightings). In a
    table of more than `4 * _SAMPLE` rows where `k` is under a quarter of
    them, a strided sample of the eligible rows' scores gives a bound that
    about `_SPREAD * k` rows pass, and the rows are scanned from `hand`
    (wrapping at the end) for the first `k` at or under it: a step looks at
    about `n / _SPREAD` rows, and successive steps sweep the table as a
    CLOCK hand does. Otherwise (or if a whole turn finds fewer than `k`), the
    exact `k` lowest (score, row).

    Args:
      counts: int [n] sighting counts of the rows handed out so far.
      seen: int64 [n] their absolute last-seen times.
      held: int64 rows never chosen now (entries < 0 are ignored).
      k: Victims wanted.
      hand: Where the scan starts.

    Returns:
      (int64 [<= k] rows in ascending order, the next hand).
    """
    counts = np.asarray(counts, np.int64)
    n, k, hand = len(counts), int(k), int(hand)
    if n and not 0 <= hand < n:
        hand = 0
    held = np.asarray(held, np.int64)
    eligible = counts > 0
    eligible[held[(held >= 0) & (held < n)]] = False
    score = np.where(
        eligible,
        np.asarray(seen, np.int64).astype(np.float64) + 1.0 - 1.0 / (1.0 + counts),
        np.inf,
    )
    if k > 0 and n > 4 * _SAMPLE and k < n // 4:
        stride = n // _SAMPLE
        sample = score[::stride][eligible[::stride]]
        j = (_SPREAD * k) // stride + 16
        if j < len(sample):
            bound = np.partition(sample, j)[j]
            passing = np.nonzero(score <= bound)[0]
            order = np.concatenate([passing[passing >= hand], passing[passing < hand]])
            if len(order) >= k:
                picked = order[:k]
                nxt = int(picked[-1]) + 1
                return np.sort(picked), 0 if nxt == n else nxt
    rows = np.nonzero(eligible)[0]
    take = min(max(k, 0), len(rows))
    if take < len(rows):
        sc = score[rows]
        kth = np.partition(sc, take - 1)[take - 1] if take else -np.inf
        below = rows[sc < kth]
        rows = np.concatenate([below, rows[sc == kth][: take - len(below)]])
    return np.sort(rows).astype(np.int64), hand


class TierMixin:
    """The tier on top of a backend (see module docstring); mixed into stock or kernels."""

    # ------------------------------------------------------------------ state
    def create_state(self, config, graph_mode: bool) -> TierState:
        hot = dataclasses.replace(config, capacity=config.memory_rows, dynamic_expansion=True)
        st = TierState.create(hot, self.map_class(), graph_mode)
        st.memory_rows = config.memory_rows
        own = self.map_class() is KeyMap
        st.cold_index = KeyIndex(
            # The kernels' map grows by 1.4 from a small array, so a table of few cold
            # keys holds no array sized for many.
            min(config.capacity, COLD_START_KEYS) if own else config.capacity,
            name="cold_index",
            map_class=self.map_class(),
            map_options={"max_load_factor": COLD_MAX_LOAD, "growth_factor": COLD_GROWTH}
            if own
            else None,
        )
        st.protected = tf.Variable(
            tf.zeros([0], tf.int64), trainable=False, name="protected", shape=tf.TensorShape([None])
        )
        st.protected_step = tf.Variable(
            tf.constant(-1, tf.int64), trainable=False, name="protected_step"
        )
        s = st.rows
        slot_dtype = next(iter(s.slots.values())).dtype if s.slots else tf.float32
        st.store = _tier_store.SegmentStore(
            config.ssd_path,
            config.name,
            config.dim,
            _np_dtype(s.values.dtype),
            list(s.slots),
            _np_dtype(slot_dtype),
            segment_bytes=_tier_store.DEFAULT_SEGMENT_BYTES,
            slot_widths=[s.slot_dims[n] for n in s.slots],
            # The kernels' map holds int32 values; `DenseHashTable` int64.
            max_locations=COLD_MAX_LOCATIONS if own else None,
        )
        return st

    @staticmethod
    def _check_slots(shard) -> None:
        st = shard.state
        if list(st.rows.slots) != st.store.slot_names:
            raise ConfigError(
                f"Tiered table {shard.name!r} must get its optimizer when it is created "
                "(`create_table(..., optimizer=...)`): its disk records were laid out for "
                f"slots {st.store.slot_names}. Received: slots {list(st.rows.slots)}"
            )

    # ------------------------------------------------------------ the prepare step
    def prepare(self, shard, keys, count: bool = True) -> tf.Operation:
        """Promotes the cold ones of unique `keys` and demotes victims (call in the lock).

        `count`: a training lookup (its keys count in the hit rate).
        """
        self._check_slots(shard)
        st = shard.state
        s = st.rows
        keys = tf.reshape(tf.cast(keys, tf.int64), [-1])
        protected, n_miss, pkeys, plocs = self._cold_keys(shard, keys)
        excess = tf.maximum(s.live_count() + n_miss - st.memory_rows, 0)
        demoted = tf.cond(
            excess > 0,
            lambda: self._demote(shard, excess, protected),
            lambda: tf.constant(0, tf.int64),
        )
        n_keys = tf.size(keys, out_type=tf.int64)
        with tf.control_dependencies([demoted]):
            promoted = self._promote(shard, pkeys, plocs, n_keys if count else -1, n_keys - n_miss)
        with tf.control_dependencies([promoted]):
            compacted = self._maybe_compact(shard)
        with tf.control_dependencies([compacted]):
            return tf.group(st.index.maybe_rebuild(), st.cold_index.maybe_rebuild())

    def _protect(self, shard, keys) -> tf.Tensor:
        """int64 [p]: the keys no demotion may take now (this step's), recorded."""
        st = shard.state
        if shard.optimizer is None:
            return keys
        step = st.opt_step.read_value()
        same = tf.equal(st.protected_step.read_value(), step)
        prot = tf.cond(
            same,
            lambda: tf.unique(tf.concat([st.protected.read_value(), keys], 0))[0],
            lambda: tf.identity(keys),
        )
        if tf.executing_eagerly() and not _lookup.recording():
            # An eager lookup nobody records: no update takes its rows by row id (one by
            # ids finds them again), so a table looked up again and again without an
            # optimizer step keeps up to `memory_rows` of those keys, then the batch only.
            # Elsewhere (recorded, a graph, a function: the exchange's owner lookups)
            # every key since the last step stays: a step looking one table up twice
            # with more keys than `memory_rows` must not demote the first lookup's rows.
            prot = tf.cond(
                tf.size(prot, out_type=tf.int64) > max(st.memory_rows, 1),
                lambda: tf.identity(keys),
                lambda: prot,
            )
        ops = [
            st.protected.assign(prot, read_value=False),
            st.protected_step.assign(step, read_value=False),
        ]
        with tf.control_dependencies(ops):
            return tf.identity(prot)

    def _cold_keys(self, shard, keys, with_rows: bool = False, probed=None):
        """(protected keys, how many keys have no memory row, the cold ones among them, their
        locations).

        `with_rows`: then also the rows of `keys` (-1: none) as the lookup found
        them; `probed`: (rows, misses, cold keys, locations) of `keys` as
        `NpuRecTierProbe` found them, used instead of looking them up.
        """
        st = shard.state
        protected = self._protect(shard, keys)
        if probed is not None:
            rows0, n_miss, pkeys, plocs = probed
            out = protected, tf.reshape(n_miss, []), pkeys, plocs
            return (*out, rows0) if with_rows else out
        with tf.control_dependencies([protected]):
            rows0 = tf.reshape(st.index.lookup(keys), [-1])
        miss = tf.boolean_mask(keys, rows0 < 0)
        locs = tf.reshape(st.cold_index.lookup(miss), [-1])
        found = locs >= 0
        n_miss = tf.size(miss, out_type=tf.int64)
        out = protected, n_miss, tf.boolean_mask(miss, found), tf.boolean_mask(locs, found)
        return (*out, rows0) if with_rows else out

    def _demote(self, shard, excess, protected) -> tf.Tensor:
        st = shard.state
        s = st.rows
        store = st.store
        upto = tf.range(s.next_row.read_value())
        counts = tf.gather(s.counts, upto)
        seen = decode_seen(tf.gather(s.last_seen, upto))
        held = tf.reshape(st.index.lookup(protected), [-1])

        def lowest(counts, seen, held, k):
            victims, store.hand = select_victims(counts, seen, held, k, store.hand)
            return victims

        victims = tf.reshape(
            tf.numpy_function(lowest, [counts, seen, held, excess], tf.int64, stateful=True), [-1]
        )
        k = tf.size(victims, out_type=tf.int64)
        vkeys = tf.gather(s.row_keys, victims)
        values = tf.gather(s.values, victims)
        slots = self._gather_slots(shard, victims)
        # The records keep int64 counts and absolute times.
        vcounts = tf.cast(tf.gather(s.counts, victims), tf.int64)
        vsaved = tf.cast(tf.gather(s.saved_counts, victims), tf.int64)
        vseen = decode_seen(tf.gather(s.last_seen, victims))

        def write(keys, values, slots, counts, saved, seen):
            recs = store.make_records(keys, values, slots, counts, saved, seen)
            locs = store.append(recs)
            store.stats["demotions"] += len(keys)
            if len(keys):
                store.reached("demotion")
            return locs

        locs = tf.numpy_function(
            write, [vkeys, values, slots, vcounts, vsaved, vseen], tf.int64, stateful=True
        )
        return self._moved_out(shard, vkeys, tf.reshape(locs, [-1]), victims, k)

    def _moved_out(self, shard, vkeys, locs, victims, k) -> tf.Tensor:
        """Demoted rows leave memory: keys `vkeys` to `cold_index` at `locs`, rows `victims`
        released (those of them no promoted row takes)."""
        st = shard.state
        with tf.control_dependencies([locs]):
            moved = tf.group(st.cold_index.insert(vkeys, locs), st.index.remove(vkeys))
        with tf.control_dependencies([moved]):
            released = st.rows.release(victims)
        with tf.control_dependencies([released]):
            return tf.identity(k)

    def _gather_slots(self, shard, rows) -> tf.Tensor:
        """[k, slot widths summed]: the rows' slots side by side ([k, 0] without an optimizer)."""
        s = shard.state.rows
        if not s.slots:
            return tf.zeros(tf.stack([tf.size(rows), 0]), tf.float32)
        return tf.concat([tf.gather(v, rows) for v in s.slots.values()], 1)

    def _read_outputs(self, shard):
        s = shard.state.rows
        slot_dtype = next(iter(s.slots.values())).dtype if s.slots else tf.float32
        return s.values.dtype, slot_dtype

    def _promote(self, shard, pkeys, plocs, n_keys, n_hot) -> tf.Operation:
        st = shard.state
        store = st.store
        row_dtype, slot_dtype = self._read_outputs(shard)

        def read(locs, n_keys, n_hot):
            if n_keys >= 0:
                store.stats["steps"] += 1
                store.stats["lookups"] += int(n_keys)
                store.stats["hits"] += int(n_hot)
            recs = store.read(locs)
            store.kill(locs)
            store.stats["promotions"] += len(locs)
            if len(locs):
                store.reached("promotion")
            # The stored bits as they are: the record's dtypes are the variables'.
            slots = recs["slots"] if store.slot_names else np.zeros((len(recs), 0))
            return (
                recs["row"].copy(),
                slots.astype(slot_dtype.as_numpy_dtype),
                recs["count"].copy(),
                store.saved_counts(recs),
                recs["last_seen"].copy(),
            )

        values, slots, counts, saved, seen = tf.numpy_function(
            read,
            [plocs, n_keys, n_hot],
            [row_dtype, slot_dtype, tf.int64, tf.int64, tf.int64],
            stateful=True,
        )
        return self._moved_in(shard, pkeys, values, slots, counts, saved, seen)

    def _moved_in(self, shard, pkeys, values, slots, counts, saved, seen, reuse=None) -> tf.Tensor:
        """Promoted rows enter memory: rows allocated, written as read, keys indexed.

        `counts`, `saved`, `seen`: int64 as records hold them, converted here (the one
        place) to the table's columns (saturated counts, encoded last-seen).
        `reuse`: (rows, released): rows to write the first promoted rows into (the
        victims', their keys leaving the index), and the op after which rows may be
        allocated for the others.
        """
        st = shard.state
        s = st.rows
        m = tf.size(pkeys, out_type=tf.int64)

        def taken():
            if reuse is None:
                return s.allocate(m)
            given, released = reuse
            extra = m - tf.size(given, out_type=tf.int64)

            def more():
                with tf.control_dependencies([released]):  # the free list as released
                    fresh, alloc = s.allocate(extra)
                with tf.control_dependencies([alloc]):
                    return tf.concat([given, fresh], 0)

            rows = tf.cond(extra > 0, more, lambda: tf.identity(given))
            return rows, tf.group(rows)

        def write():
            rows, alloc = taken()

            with tf.control_dependencies([rows]):
                ops = [
                    s.values.scatter_update(
                        tf.IndexedSlices(tf.reshape(values, [-1, shard.dim]), rows)
                    ),
                    s.row_keys.scatter_update(tf.IndexedSlices(pkeys, rows)),
                    s.counts.scatter_update(
                        tf.IndexedSlices(saturated(tf.reshape(counts, [-1])), rows)
                    ),
                    s.saved_counts.scatter_update(
                        tf.IndexedSlices(saturated(tf.reshape(saved, [-1])), rows)
                    ),
                    s.last_seen.scatter_update(
                        tf.IndexedSlices(encode_seen(tf.reshape(seen, [-1])), rows)
                    ),
                    st.index.insert(pkeys, rows),
                    st.cold_index.remove(pkeys),
                ]
                flat = tf.reshape(slots, tf.stack([m, sum(s.slot_dims.values())]))
                at = 0
                for name, var in s.slots.items():
                    w = s.slot_dims[name]
                    ops.append(var.scatter_update(tf.IndexedSlices(flat[:, at : at + w], rows)))
                    at += w
            with tf.control_dependencies([alloc, *ops]):
                return tf.constant(True)

        return tf.cond(m > 0, write, lambda: tf.identity(tf.size(values) >= 0))

    def _maybe_compact(self, shard) -> tf.Tensor:
        st = shard.state
        store = st.store

        def relocate():
            seg = store.compaction_candidate()
            if seg < 0:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            return store.relocate(seg)

        keys, locs = tf.numpy_function(relocate, [], [tf.int64, tf.int64], stateful=True)
        return self._relocated(shard, keys, locs)

    def _relocated(self, shard, keys, locs) -> tf.Tensor:
        """`cold_index` follows the records a compaction moved to `locs`."""
        st = shard.state
        keys, locs = tf.reshape(keys, [-1]), tf.reshape(locs, [-1])
        # The map's insert keeps an existing key's value: remove first.
        removed = st.cold_index.remove(keys)
        with tf.control_dependencies([removed]):
            return tf.group(st.cold_index.insert(keys, locs))

    # ---------------------------------------------------------------- lookups
    def _train_unique(self, shard, keys, counts, times, from_feature, batch_time):
        prep = self.prepare(shard, keys)
        with tf.control_dependencies([prep]):
            keys = tf.identity(keys)
            return super()._train_unique(shard, keys, counts, times, from_feature, batch_time)

    def lookup_unique(self, shard, keys, counts, times, training: bool, from_feature, batch_time):
        if training:
            return super().lookup_unique(
                shard, keys, counts, times, training, from_feature, batch_time
            )
        st = shard.state
        rows = tf.reshape(st.index.lookup(keys), [-1])
        emb = self.gather(shard, rows)
        miss_pos = tf.where(rows < 0)[:, 0]
        locs = tf.reshape(st.cold_index.lookup(tf.gather(keys, miss_pos)), [-1])
        have = locs >= 0
        cold = tf.reshape(self._cold_rows(shard, tf.boolean_mask(locs, have)), [-1, shard.dim])
        at = tf.boolean_mask(miss_pos, have)[:, None]
        emb = tf.tensor_scatter_nd_update(emb, at, cold)
        # A cold key has a row (on disk): not "no row", which reads the fallback.
        rows = tf.tensor_scatter_nd_update(
            rows, at, tf.fill(tf.shape(at)[:1], tf.constant(COLD_ROW, tf.int64))
        )
        return rows, emb

    def _cold_rows(self, shard, locs) -> tf.Tensor:
        """float32 [m, dim]: the rows of the records at `locs`, verified (inference reads)."""
        store = shard.state.store

        def read(locs):  # float32 holds every bfloat16 / float16 value exactly
            return store.read(locs)["row"].astype(np.float32)

        return tf.numpy_function(read, [locs], tf.float32, stateful=True)

    def find_rows(self, shard, keys) -> tf.Tensor:
        def promote_then_find():
            with tf.control_dependencies([self.prepare(shard, keys, count=False)]):
                return shard.state.index.lookup(keys)

        return shard.state.locked(promote_then_find)

    # ------------------------------------------------------------ maintenance
    def _evict(self, shard, now) -> tf.Tensor:
        c, st = shard.config, shard.state
        store = st.store
        now = tf.where(tf.equal(now, NO_NOW), shard.default_now(), now)
        hot = super()._evict(shard, now)

        def idle(now):
            recs, locs = store.live_records()
            gone = now - recs["last_seen"] > c.eviction_threshold
            store.kill(locs[gone])
            return recs["key"][gone].copy()

        with tf.control_dependencies([hot]):
            keys = tf.reshape(tf.numpy_function(idle, [now], tf.int64, stateful=True), [-1])
        ops = [st.cold_index.remove(keys), st.deleted.insert(keys, tf.ones_like(keys))]
        with tf.control_dependencies(ops):
            rebuilt = _rebuilt(st.cold_index)
        with tf.control_dependencies([rebuilt]):
            return hot + tf.size(keys, out_type=tf.int64)

    def size(self, shard) -> tf.Tensor:
        return super().size(shard) + shard.state.cold_index.size()

    def export(self, shard, min_period) -> dict[str, tf.Tensor]:
        st = shard.state
        store = st.store
        out = super().export(shard, min_period)
        names = list(st.rows.slots)
        row_dtype, slot_dtype = self._read_outputs(shard)

        def cold(min_period):  # rows and slots in their stored dtypes, bits unchanged
            if store.snapshot_to is not None and min_period == 0:
                # A checkpoint's full save: sealed segments linked, not read (`snapshot`).
                store.snapshot_manifest = store.snapshot(store.snapshot_to)
                recs = np.zeros(0, store.dtype)
            elif min_period > 0:  # a delta: only segments written this period
                recs = store.changed_records(int(min_period))
                store.reached("save")
            else:
                recs, _ = store.live_records()
                store.reached("save")
            return (
                recs["key"].copy(),
                recs["row"].copy(),
                recs["count"].copy(),
                recs["last_seen"].copy(),
                *store.split_slots(recs),
            )

        with tf.control_dependencies(list(out.values())):
            parts = tf.numpy_function(
                cold,
                [tf.cast(min_period, tf.int64)],
                [tf.int64, row_dtype, tf.int64, tf.int64, *[slot_dtype] * len(names)],
                stateful=True,
            )
        cold_cols = {
            "keys": parts[0],
            "values": parts[1],
            "counts": parts[2],
            "last_seen": parts[3],
        }
        cold_cols.update({f"slot/{n}": parts[4 + i] for i, n in enumerate(names)})
        widths = st.rows.slot_dims
        for k, v in cold_cols.items():
            shape = [-1, shard.dim] if k == "values" else [-1]
            if k.startswith("slot/"):
                shape = [-1, widths[k[len("slot/") :]]]
            out[k] = tf.concat([out[k], tf.reshape(v, shape)], 0)
        return out

    def load(self, shard, state: dict[str, tf.Tensor]) -> tf.Operation:
        st = shard.state
        store = st.store
        keys = tf.reshape(state["keys"], [-1])
        counts = tf.reshape(state["counts"], [-1])
        seen = tf.reshape(state["last_seen"], [-1])
        c = tf.cast(counts, tf.float64)
        score = tf.cast(seen, tf.float64) + 1.0 - 1.0 / (1.0 + c)
        order = tf.argsort(-score, stable=True)
        hot, cold = order[: st.memory_rows], order[st.memory_rows :]
        per_row = ["keys", "values", "counts", "last_seen", *[f"slot/{n}" for n in st.rows.slots]]
        hot_state = dict(state)
        for k in per_row:
            hot_state[k] = tf.gather(state[k], hot)
        load_hot = super().load(shard, hot_state)
        ckeys = tf.gather(keys, cold)
        cslots = self._stack_slots(shard, state, cold)
        cvalues = st.rows.stored(tf.gather(state["values"], cold))
        if tf.executing_eagerly():  # a file at a time into an index sized once
            store.reset()
            total = int(tf.size(ckeys)) + sum(int(f["live"].sum()) for f in _files(store))
            empty = tf.zeros([0], tf.int64)
            st.cold_index.reset(empty, empty)
            st.cold_index.reserve(total)
            for k, loc in _adopted(store):
                st.cold_index.insert(tf.constant(k), tf.constant(loc))
                del k, loc
            recs = store.make_records(
                ckeys.numpy(),
                cvalues.numpy(),
                cslots.numpy(),
                tf.gather(counts, cold).numpy(),
                tf.gather(counts, cold).numpy(),
                tf.gather(seen, cold).numpy(),
            )
            st.cold_index.insert(ckeys, tf.constant(store.append(recs)))
            return tf.group(
                st.protected.assign(tf.zeros([0], tf.int64), read_value=False),
                st.protected_step.assign(tf.constant(-1, tf.int64), read_value=False),
            )

        def write(keys, values, slots, counts, seen):
            store.reset()
            found_keys, found_locs = [], []
            for k, loc in _adopted(store):
                found_keys.append(k)
                found_locs.append(loc)
            recs = store.make_records(keys, values, slots, counts, counts, seen)
            return (
                np.concatenate([*found_keys, np.asarray(keys, np.int64)]),
                np.concatenate([*found_locs, store.append(recs)]),
            )

        with tf.control_dependencies([load_hot]):
            ckeys, locs = tf.numpy_function(
                write,
                [
                    ckeys,
                    # Rounded to nearest as the in-memory rows' `load` does (exact
                    # when the checkpoint holds the table's storage dtype).
                    cvalues,
                    cslots,
                    tf.gather(counts, cold),
                    tf.gather(seen, cold),
                ],
                [tf.int64, tf.int64],
                stateful=True,
            )
        reset = st.cold_index.reset(tf.reshape(ckeys, [-1]), tf.reshape(locs, [-1]))
        with tf.control_dependencies([reset]):
            return tf.group(
                st.protected.assign(tf.zeros([0], tf.int64), read_value=False),
                st.protected_step.assign(tf.constant(-1, tf.int64), read_value=False),
            )

    def _stack_slots(self, shard, state, rows) -> tf.Tensor:
        names = list(shard.state.rows.slots)
        if not names:
            return tf.zeros(tf.stack([tf.size(rows), 0]), tf.float32)
        return tf.concat([tf.gather(state[f"slot/{n}"], rows) for n in names], 1)

    def end_period(self, shard) -> tf.Operation:
        store = shard.state.store

        def bump():
            store.period += 1
            return np.int64(store.period)

        hot = super().end_period(shard)
        with tf.control_dependencies([hot]):
            return tf.group(tf.numpy_function(bump, [], tf.int64, stateful=True))

    def memory_stats(self, shard) -> dict[str, tf.Tensor]:
        out = dict(super().memory_stats(shard))
        cold = shard.state.cold_index
        out["memory_rows"] = out["live_keys"]
        out["disk_rows"] = cold.size()
        out["live_keys"] = out["live_keys"] + cold.size()
        out["index"] = out["index"] + cold.buckets() * cold.bucket_bytes
        return out

    def tier_stats(self, table) -> dict[str, float]:
        """`SparseTable.tier_stats` of a table on this backend."""
        return tier_stats(table)


class TieredStockBackend(TierMixin, StockBackend):
    """The stock backend with a disk tier."""

    name = "stock+tier"


class TieredKernelBackend(TierMixin, KernelBackend):
    """The kernel backend with a disk tier (the fused lookup runs after `prepare`).

    Its `prepare` does the tier's work per row in the kernels of
    `npu_rec/_kernels/tier_io.cc` (reading the batch's cold records with
    `pread`, victim selection, packing records with their checksums,
    verifying and unpacking the records read) and keeps the store's
    bookkeeping and the `pwrite` in three `numpy_function` calls per step
    (the NumPy path: four): the segment files' descriptors, the period and
    the victim hand; then append the victims' records; then mark the
    promoted ones dead and compact, beside the indexes' moves. The read (and
    its verification) and the victims' selection and packing change nothing,
    so they may run side by side; the first change (the append) waits for the
    records read to be verified, so a corrupted record fails the step with
    the table untouched. The fused lookup's unique keys (`tf.unique`'s, in
    its order), their rows in the index and the cold ones' locations in
    `cold_index` come from one kernel, `NpuRecTierProbe`; the victims' held
    rows are those rows (looked up again only when earlier lookups of the
    optimizer step protected more keys). Inference reads go through the
    same read and unpack kernels.
    """

    name = "kernels+tier"

    def prepare(self, shard, keys, count: bool = True, probed=None) -> tf.Operation:
        """`TierMixin.prepare`; `probed`: what `NpuRecTierProbe` found of unique `keys`.

        (rows, misses, cold keys, their locations), see `_cold_keys`.
        """
        self._check_slots(shard)
        st = shard.state
        s = st.rows
        store = st.store
        keys = tf.reshape(tf.cast(keys, tf.int64), [-1])

        def start():
            return (*store.segment_table(), np.int64(store.period), np.int64(store.hand))

        # Needs no key: made first, it runs beside the batch's first index work.
        *table, period, hand = tf.numpy_function(
            start, [], [tf.int64, tf.int64, tf.string, tf.int64, tf.int64], stateful=True
        )
        period, hand = tf.reshape(period, []), tf.reshape(hand, [])
        protected, n_miss, pkeys, plocs, rows0 = self._cold_keys(
            shard, keys, with_rows=True, probed=probed
        )
        n_keys = tf.size(keys, out_type=tf.int64)
        values, slots, counts, saved, seen = self._read(shard, plocs, table, period)
        excess = tf.maximum(s.live_count() + n_miss - st.memory_rows, 0)

        def pack():
            # The protected keys' rows: those `rows0` holds when `protected` is `keys`
            # (no earlier lookup in this optimizer step), else looked up.
            n = tf.minimum(tf.size(protected), tf.size(keys))
            same = tf.logical_and(
                tf.equal(tf.size(protected), tf.size(keys)),
                tf.reduce_all(tf.equal(protected[:n], keys[:n])),
            )
            held = tf.cond(
                same, lambda: rows0, lambda: tf.reshape(st.index.lookup(protected), [-1])
            )
            victims, next_hand = _ops.tier_victims(
                counts=s.counts.handle,
                last_seen=s.last_seen.handle,
                held_rows=held,
                num_rows=s.next_row.read_value(),
                k=excess,
                hand=hand,
            )
            recs = _ops.tier_pack(
                row_keys=s.row_keys.handle,
                values=s.values.handle,
                counts=s.counts.handle,
                saved_counts=s.saved_counts.handle,
                last_seen=s.last_seen.handle,
                slots=[v.handle for v in s.slots.values()],
                rows=victims,
                period=period,
                weights=tf.constant(store.weights),
                dim=shard.dim,
                slot_widths=list(store.slot_widths),
            )
            return victims, recs, next_hand

        def nothing():
            return tf.zeros([0], tf.int64), tf.zeros([0, store.words], tf.int64), hand

        # Victims and their records change nothing: they may run beside the read (when
        # its calls leave a thread free); the first change, `write`, waits for the records
        # read to be verified, so a corrupted one fails the step with the table untouched.
        victims, recs, hand = tf.cond(excess > 0, pack, nothing)

        def write(recs, hand, n_keys, n_hot):
            # The victims' records appended (a failed append leaves none of them
            # live, the statistics and the hand as they were).
            locs = store.append(recs)
            if n_keys >= 0:
                store.stats["steps"] += 1
                store.stats["lookups"] += int(n_keys)
                store.stats["hits"] += int(n_hot)
            store.hand = int(hand)
            store.stats["demotions"] += len(recs)
            if len(recs):
                store.reached("demotion")
            return locs

        def settle(plocs):
            # The promoted records marked dead (their rows are read into `values`),
            # then a sparse sealed segment compacted.
            store.stats["bytes_read"] += len(plocs) * store.dtype.itemsize
            store.kill(plocs)
            store.stats["promotions"] += len(plocs)
            if len(plocs):
                store.reached("promotion")
            seg = store.compaction_candidate()
            if seg < 0:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            return store.relocate(seg)

        with tf.control_dependencies([values]):  # verified before anything changes
            locs = tf.numpy_function(
                write,
                [recs, hand, n_keys if count else tf.constant(-1, tf.int64), n_keys - n_miss],
                tf.int64,
                stateful=True,
            )
        # The promoted rows are written into the victims' rows (no release and
        # allocation between): the first `reused` victims keep their rows, the
        # others are released. Both moves start once the victims are on disk (and
        # so packed, and the records read verified) and run side by side.
        k = tf.size(victims, out_type=tf.int64)
        reused = tf.minimum(tf.size(pkeys, out_type=tf.int64), k)
        demoted = self._moved_out(shard, recs[:, 0], tf.reshape(locs, [-1]), victims[reused:], k)
        # The store's own work, beside the indexes' (after the append: one store
        # call at a time).
        with tf.control_dependencies([locs]):
            ckeys, clocs = tf.numpy_function(settle, [plocs], [tf.int64, tf.int64], stateful=True)
            promoted = self._moved_in(
                shard, pkeys, values, slots, counts, saved, seen, reuse=(victims[:reused], demoted)
            )
        # After the victims' keys entered `cold_index`: a compaction may have moved them.
        with tf.control_dependencies([promoted, demoted]):
            compacted = self._relocated(shard, ckeys, clocs)
        with tf.control_dependencies([compacted]):
            return tf.group(*[_rebuilt(i) for i in (st.index, st.cold_index)])

    def _read(self, shard, locs, table, period):
        """(values, slots, counts, saved counts, last-seen) of the records at `locs`, verified.

        `table`: the store's `segment_table()` as tensors, taken in the same
        step (the descriptors stay open until the store next changes).
        """
        store = shard.state.store
        row_dtype, slot_dtype = self._read_outputs(shard)
        segments, fds, paths = table
        words = _ops.tier_read(
            locations=locs,
            segments=tf.reshape(segments, [-1]),
            fds=tf.reshape(fds, [-1]),
            paths=tf.reshape(paths, [-1]),
            dirs=tf.constant(store.dirs, tf.string),
            words=store.words,
            per_segment=store.per_segment,
            table=store.name,
        )
        return _ops.tier_unpack(
            records=words,
            weights=tf.constant(store.weights),
            # Each record's file, named if its checksum fails.
            segment_of=tf.searchsorted(
                tf.reshape(segments, [-1]), locs // store.per_segment, out_type=tf.int64
            ),
            paths=tf.reshape(paths, [-1]),
            period=period,
            T=row_dtype,
            S=slot_dtype,
            dim=shard.dim,
            slot_width=sum(store.slot_widths),
            table=store.name,
        )

    def _cold_rows(self, shard, locs) -> tf.Tensor:
        store = shard.state.store

        def start(m):
            store.stats["bytes_read"] += int(m) * store.dtype.itemsize
            return (*store.segment_table(), np.int64(store.period))

        *table, period = tf.numpy_function(
            start,
            [tf.size(locs, out_type=tf.int64)],
            [tf.int64, tf.int64, tf.string, tf.int64],
            stateful=True,
        )
        values = self._read(shard, locs, table, tf.reshape(period, []))[0]
        return tf.cast(values, tf.float32)  # exact for bfloat16 / float16

    def fused_lookup(self, shard, ids, id_counts, times, from_feature: bool, batch_time):
        if id_counts is not None:
            with tf.control_dependencies([self.prepare(shard, ids)]):
                ids = tf.identity(ids)
            return super().fused_lookup(shard, ids, id_counts, times, from_feature, batch_time)
        # `tf.unique_with_counts` of the ids and both indexes' view of them, by one kernel.
        st = shard.state
        uniq, rows, index, counts, *cold = _ops.tier_probe(
            st.index, st.cold_index, tf.reshape(tf.cast(ids, tf.int64), [-1])
        )
        with tf.control_dependencies([self.prepare(shard, uniq, probed=(rows, *cold))]):
            if batch_time is None or from_feature:  # times and clamping are per id
                ids = tf.identity(ids)
                return super().fused_lookup(shard, ids, None, times, from_feature, batch_time)
            # One time for the batch: the unique keys with their sightings are the
            # same lookup, with no repeats left to merge; the rows the probe found stay
            # theirs (held: never demoted by this lookup), so only the others (the
            # promoted keys, new keys) are probed again.
            out = super().fused_lookup(
                shard, uniq, counts, times, from_feature, batch_time, known_rows=rows
            )
            return (out[0], index, *out[2:])


def _files(store) -> list[dict]:
    """The checkpoint files a restore gives `store` (`restore_from`), or none."""
    return [] if store.restore_from is None else store.restore_from["files"]


def _adopted(store):
    """(keys, locations) of each checkpoint file `store.adopt`s, a file at a time."""
    src = store.restore_from  # a checkpoint's cold files (`npu_rec.checkpoint._cold`)
    if src is None:
        return
    store.period = max(store.period, int(src["period"]) + 1)
    for f in src["files"]:
        yield store.adopt(
            f["path"], src["dtype"], f["records"], f["live"], src["gone"], src["mine"]
        )


def _rebuilt(index: KeyIndex) -> tf.Tensor:
    """`index.maybe_rebuild()`, but nothing for npu_rec's own map (it drops its tombstones)."""
    if isinstance(index.map, KeyMap):
        return tf.constant(False)
    return index.maybe_rebuild()


_TIERED = {StockBackend: TieredStockBackend(), KernelBackend: TieredKernelBackend()}


def tiered_backend(base) -> TierMixin:
    """The tiered backend over `base` (the backend `select_backend` chose)."""
    return _TIERED[KernelBackend if isinstance(base, KernelBackend) else StockBackend]


def tier_stats(table) -> dict[str, float]:
    """Counters of a tiered table's shards, summed (see `SparseTable.tier_stats`)."""
    total: dict[str, float] = {}
    cold = disk = hot = live_bytes = 0
    for shard in table.shards:
        store = shard.state.store
        for k, v in store.stats.items():
            total[k] = total.get(k, 0) + v
        cold += store.num_live()
        disk += store.disk_bytes()
        live_bytes += store.ram_bytes()
    eager = tf.executing_eagerly() and not table._graph_mode
    hot = int(sum(int(s.state.rows.live_count()) for s in table.shards)) if eager else -1
    index = -1
    if eager:
        index = sum(
            int(s.state.cold_index.buckets()) * s.state.cold_index.bucket_bytes
            for s in table.shards
        )
    total["hit_rate"] = total["hits"] / total["lookups"] if total["lookups"] else 0.0
    total["cold_keys"] = cold
    total["memory_keys"] = hot
    total["disk_bytes"] = disk
    total["disk_bytes_per_key"] = disk / cold if cold else 0.0
    total["cold_index_bytes"] = index
    total["cold_liveness_bytes"] = live_bytes
    ram = index + live_bytes if index >= 0 else -1
    total["ram_bytes_per_cold_key"] = ram / cold if cold and ram >= 0 else 0.0
    return total
