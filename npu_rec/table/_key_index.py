"""`KeyIndex`: the key -> row map of one table (shard), an open-addressing hash map.

It wraps an open-addressing map with `DenseHashTable`'s API, the class the
table's backend gives it: TF's own (`MutableDenseHashTable`, a flat bucket
array probed in place) on the stock path, and the kernels' `NpuRecKeyMap`
(`npu_rec/_kernels/_key_map.py`: one array of 12-byte {key, row} buckets,
probed by the kernels directly) on the kernel path; both take TF's lookup ops
and write the same checkpoint tensors. Rather than `MutableHashTable` (a node-based
`std::unordered_map`): inserts are about 4x faster and the map costs 12-16 B per
bucket instead of ~40-130 B per key (see docs/design.md "The key index"). Two
things make it safe for raw ids:

* The kernel hashes integer keys by identity into a power-of-two mask, so ids
  that differ only in their high bits (`field << 32 | value`) would share
  probe chains. Keys are therefore stored *mixed* by a bijection of the
  64-bit integers (`_mix`: multiply by an odd constant, then fold the high
  half into the low half), which spreads every bit of the raw id over the
  bucket bits. A bijection introduces no collisions.
* The kernel reserves two key values (empty and deleted buckets). They are
  two values of the *mixed* space, i.e. the two raw ids `_unmix(EMPTY_KEY)`
  and `_unmix(DELETED_KEY)` (`RESERVED_RAW_KEYS`), which the kernel refuses.
  Those two ids never reach it: their rows are kept beside the map, in a
  2-element variable (`reserved_rows`, -1 = absent), so every int64 id is a
  valid key.

Removal leaves tombstones, which the kernel reuses for later inserts; a
`reset` (restore, or `rebuild` after heavy eviction) starts from an empty
bucket array sized for the live keys.
"""

from __future__ import annotations

import tensorflow as tf

#: The kernel's reserved bucket markers (in the mixed key space).
EMPTY_KEY = -(2**63)
DELETED_KEY = -(2**63) + 1
#: The kernel grows (doubles) its bucket array beyond this load.
MAX_LOAD = 0.8
#: A new index is allocated for at most this many keys; beyond, it grows with the
#: live keys (doubling at `MAX_LOAD`), so its array stays within 2x of them
#: instead of being sized (and rounded up to a power of two) for the capacity.
START_KEYS = 1 << 16
_MUL = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
_MUL_INV = pow(_MUL, -1, 2**64)


def _fold(u: tf.Tensor) -> tf.Tensor:
    """x ^ (x >> 32) on uint64: its own inverse."""
    return tf.bitwise.bitwise_xor(u, tf.bitwise.right_shift(u, tf.constant(32, tf.uint64)))


def _mix(keys: tf.Tensor) -> tf.Tensor:
    """int64 [n] -> int64 [n], a bijection spreading all bits into the low ones."""
    u = tf.bitcast(keys, tf.uint64) * tf.constant(_MUL, tf.uint64)
    return tf.bitcast(_fold(u), tf.int64)


def _unmix(mixed: tf.Tensor) -> tf.Tensor:
    """The inverse of `_mix`."""
    u = _fold(tf.bitcast(mixed, tf.uint64)) * tf.constant(_MUL_INV, tf.uint64)
    return tf.bitcast(u, tf.int64)


def _is_reserved(mixed: tf.Tensor) -> tf.Tensor:
    """bool [n]: the mixed key is one of the kernel's two reserved values."""
    return mixed <= DELETED_KEY


def _unmix_int(x: int) -> int:
    u = x % 2**64
    u ^= u >> 32
    u = (u * _MUL_INV) % 2**64
    return u - 2**64 if u >= 2**63 else u


#: The two raw int64 ids the kernel cannot hold; `KeyIndex` keeps them aside.
RESERVED_RAW_KEYS = (_unmix_int(EMPTY_KEY), _unmix_int(DELETED_KEY))


def buckets_for(capacity: int) -> int:
    """Power-of-two bucket count holding `capacity` keys below `MAX_LOAD`."""
    n = 8
    while n * MAX_LOAD < capacity:
        n *= 2
    return n


class KeyIndex:
    """Raw int64 key -> int64 row (-1 when absent).

    Args:
      capacity: The table's capacity: the bucket array (`bucket_bytes` each) is
        allocated for `min(capacity, START_KEYS)` keys and grows with the keys.
      name: Kernel resource name.
      map_class: The hash map: `tf.lookup.experimental.DenseHashTable` or a class
        with its API and checkpoint format (the kernels' `KeyMap`).
      map_options: More keyword arguments of `map_class` (the kernels' `KeyMap`
        takes `max_load_factor` and `growth_factor`).
    """

    def __init__(
        self,
        capacity: int,
        name: str = "index",
        map_class=tf.lookup.experimental.DenseHashTable,
        map_options: dict | None = None,
    ):
        options = map_options or {}
        growth = options.get("growth_factor", 2.0)
        start = min(capacity, START_KEYS)
        # A map sized exactly (growth other than 2) starts exactly too.
        self.initial_buckets = (
            buckets_for(start)
            if growth == 2.0
            else max(8, -(-start * 1000 // round(1000 * options["max_load_factor"])))
        )
        #: Bytes of one bucket: 16 in `DenseHashTable` (key and value arrays), 12 in
        #: the kernels' map ({int64 key, int32 row}).
        self.bucket_bytes = getattr(map_class, "BUCKET_BYTES", 16)
        self.map = map_class(
            tf.int64,
            tf.int64,
            default_value=-1,
            empty_key=EMPTY_KEY,
            deleted_key=DELETED_KEY,
            initial_num_buckets=self.initial_buckets,
            name=name,
            **options,
        )
        # Keys removed since the last reset: an upper bound on the tombstones.
        self.removed = tf.Variable(
            tf.constant(0, tf.int64), trainable=False, name=f"{name}_removed"
        )
        # Rows of the two raw ids whose mixed values the kernel reserves (-1 = absent).
        self.reserved_rows = tf.Variable(
            tf.constant([-1, -1], tf.int64), trainable=False, name=f"{name}_reserved_rows"
        )

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """int64 [n] rows of raw `keys` (-1 = absent)."""
        return self.lookup_mixed(_mix(keys))

    def lookup_mixed(self, mixed: tf.Tensor) -> tf.Tensor:
        """int64 [n] rows of already mixed keys (as `held_mixed` returns them)."""
        reserved = _is_reserved(mixed)

        def routed():
            rows = self.map.lookup(tf.where(reserved, tf.zeros_like(mixed), mixed))
            slot = tf.where(reserved, mixed - EMPTY_KEY, tf.zeros_like(mixed))
            return tf.where(reserved, tf.gather(self.reserved_rows.read_value(), slot), rows)

        # Almost no batch holds a reserved id: skip the routing then (measured: the
        # routing ops cost about a third of the kernel's lookup of 20k keys).
        return tf.cond(tf.reduce_any(reserved), routed, lambda: self.map.lookup(mixed))

    def _insert_mixed(self, mixed: tf.Tensor, rows: tf.Tensor) -> tf.Operation:
        reserved = _is_reserved(mixed)
        keep = tf.logical_not(reserved)
        return tf.group(
            self.map.insert(tf.boolean_mask(mixed, keep), tf.boolean_mask(rows, keep)),
            self.reserved_rows.scatter_update(
                tf.IndexedSlices(
                    tf.boolean_mask(rows, reserved), tf.boolean_mask(mixed, reserved) - EMPTY_KEY
                )
            ),
        )

    @staticmethod
    def unmix(mixed: tf.Tensor) -> tf.Tensor:
        """Raw keys of mixed keys."""
        return _unmix(mixed)

    def insert(self, keys: tf.Tensor, rows: tf.Tensor) -> tf.Operation:
        """Maps absent raw `keys` (unique) to `rows`."""
        return self._insert_mixed(_mix(keys), rows)

    def remove(self, keys: tf.Tensor) -> tf.Operation:
        """Removes raw `keys` (absent ones are ignored)."""
        count = self.removed.assign_add(tf.size(keys, out_type=tf.int64), read_value=False)
        mixed = _mix(keys)
        reserved = _is_reserved(mixed)
        slots = tf.boolean_mask(mixed, reserved) - EMPTY_KEY
        clear = self.reserved_rows.scatter_update(
            tf.IndexedSlices(tf.fill(tf.shape(slots), tf.constant(-1, tf.int64)), slots)
        )
        return tf.group(
            self.map.remove(tf.boolean_mask(mixed, tf.logical_not(reserved))), clear, count
        )

    def maybe_rebuild(self) -> tf.Tensor:
        """Rebuilds when tombstones could fill the array; returns whether it did.

        The kernel grows its array when the *live* keys pass `MAX_LOAD` but
        never counts tombstones, so after much eviction most empty buckets
        could become tombstones and a miss would probe long chains. The array
        has at least `max(initial, buckets_for(live))` buckets (it never
        shrinks, and doubles while the live keys pass `MAX_LOAD`); once live
        keys plus the keys removed since the last reset could pass 90% of
        that, the held keys are re-inserted into a fresh array.
        """
        live = self.map.size()
        # log2 of the smallest power of two holding the live keys below MAX_LOAD (the
        # 1e-9 keeps an exact power from rounding up to the next one).
        need = tf.math.ceil(
            tf.math.log(tf.cast(live, tf.float64) / MAX_LOAD)
            / tf.math.log(tf.constant(2.0, tf.float64))
            - 1e-9
        )
        floor = tf.maximum(
            tf.constant(self.initial_buckets, tf.float64),
            tf.pow(tf.constant(2.0, tf.float64), need),
        )
        crowded = tf.cast(live + self.removed.read_value(), tf.float64) > 0.9 * floor

        def rebuild():
            with tf.control_dependencies([self.rebuild()]):
                return tf.constant(True)

        return tf.cond(crowded, rebuild, lambda: tf.constant(False))

    def size(self) -> tf.Tensor:
        """int64 scalar: keys held."""
        return self.map.size() + tf.math.count_nonzero(self.reserved_rows.read_value() >= 0)

    def held_mixed(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(mixed keys int64 [k], rows int64 [k]) of the held buckets.

        `DenseHashTable`'s export hands out its live bucket arrays, not a copy
        (`NpuRecKeyMap` copies): order any insert or remove of this index after
        the returned tensors (as `rebuild` does).
        """
        mixed, rows = self.map.export()
        mixed, rows = tf.reshape(mixed, [-1]), tf.reshape(rows, [-1])
        held = tf.logical_not(_is_reserved(mixed))
        special = self.reserved_rows.read_value()
        return (
            tf.concat(
                [
                    tf.boolean_mask(mixed, held),
                    tf.boolean_mask(tf.constant([EMPTY_KEY, DELETED_KEY], tf.int64), special >= 0),
                ],
                0,
            ),
            tf.concat([tf.boolean_mask(rows, held), tf.boolean_mask(special, special >= 0)], 0),
        )

    def export(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(raw keys int64 [k], rows int64 [k]) of every held key, in bucket order."""
        mixed, rows = self.held_mixed()
        return _unmix(mixed), rows

    def reset(self, keys: tf.Tensor, rows: tf.Tensor) -> tf.Operation:
        """Replaces the contents by raw `keys` -> `rows`, in a fresh (tombstone-free) array."""
        return self._reset_mixed(_mix(keys), rows)

    def reserve(self, keys: int) -> tf.Operation:
        """Sizes the array once for `keys` keys in all (the held ones included).

        For a bulk insert of known size: the array is allocated once at its
        final size instead of growing (and rehashing every key) on the way,
        which also leaves no outgrown arrays behind. The kernels' map grows in
        place (`KeyMap.reserve`, exactly sized); `DenseHashTable`'s held keys
        are re-inserted into a fresh power-of-two array.
        """
        if hasattr(self.map, "reserve"):
            return self.map.reserve(keys)
        return self._reset_mixed(*self.held_mixed(), buckets=buckets_for(keys))

    def buckets(self) -> tf.Tensor:
        """int64 scalar: buckets of the map's array (`bucket_bytes` each)."""
        if hasattr(self.map, "counts"):
            return self.map.counts()[0]
        # `DenseHashTable`'s export hands out its live arrays (no copy).
        return tf.size(self.map.export()[0], out_type=tf.int64)

    def _reset_mixed(self, mixed: tf.Tensor, rows: tf.Tensor, buckets: int = 0) -> tf.Operation:
        """`reset` for mixed keys (into at least `buckets` buckets).

        The kernel's import adopts the tensors it is given as its bucket arrays
        (no copy), and later inserts and removes write into them in place. The
        empty arrays are therefore made by `DeepCopy`, a stateful op that
        allocates a new buffer on every run: a `tf.fill` of constants would be
        constant-folded in a graph (`tf.function`, v1) into one `Const` buffer
        that the table would adopt, fill, and hand back "empty" to the next
        reset (duplicate, lost and evicted keys came back after the second
        rebuild). The import waits for `mixed` and `rows`, which
        may be computed from the current arrays (`rebuild`). Run eagerly, the
        `tf.fill` is a new buffer already (no copy beside it).
        """
        buckets = max(self.initial_buckets, buckets)

        # An empty array of the initial size; the insert grows it (one rebucketing of
        # the still-empty array) to the smallest power of two holding the keys.
        # The kernel takes [buckets, 1] arrays; graph-mode shape inference expects
        # rank 1, so the static shape is hidden (as when TF restores this table).
        def fresh(value):
            filled = tf.fill([buckets, 1], tf.constant(value, tf.int64))
            if tf.executing_eagerly():
                return filled
            return tf.compat.v1.placeholder_with_default(tf.raw_ops.DeepCopy(x=filled), shape=None)

        with tf.control_dependencies([mixed, rows]):
            empty = tf.raw_ops.LookupTableImportV2(
                table_handle=self.map.resource_handle, keys=fresh(EMPTY_KEY), values=fresh(-1)
            )
        with tf.control_dependencies([empty]):
            cleared = self.reserved_rows.assign(tf.constant([-1, -1], tf.int64), read_value=False)
        with tf.control_dependencies([cleared]):
            return tf.group(
                self._insert_mixed(mixed, rows),
                self.removed.assign(tf.constant(0, tf.int64), read_value=False),
            )

    def rebuild(self) -> tf.Operation:
        """Re-inserts the held keys into a fresh array (drops tombstones)."""
        return self._reset_mixed(*self.held_mixed())
