"""The trained fallback of keys not admitted yet (`create_table(..., not_admitted="hashed")`).

With admission (`access_threshold >= 2`) a key reads the zero vector and
receives no update until its sightings reach the threshold (mx_rec's
behaviour, `not_admitted="zeros"`, the default). With `not_admitted="hashed"`
the table owns a small dense table, its fallback: `fallback_buckets` rows of
the table's width, trained by the table's optimizer (its own slots and step
count). A key without a row reads row `bucket_of(key)` = `splitmix64(key ^
salt) mod fallback_buckets` of it, and the gradient of that read updates that
row (the gradients of all keys of a batch sharing a bucket are summed, as for
repeated ids). When a key is admitted, its new row starts from the current
value of its fallback row instead of the initializer.

Everything happens above the backend: the lookup functions know which keys
have no row (`rows < 0`) once the backend has looked them up, so they fill
those embeddings from the fallback (`HashedFallback.fill`) and send their
gradients to it (`HashedFallback.apply`); admission reads the fallback through
the shard's `initial_values`. The compiled kernels need no change: a table
with a fallback admits at its second sighting at the earliest, so its new rows
always come from the stock admission path.

One fallback belongs to the table a user created (a `ShardedTable` has one
for all its shards; the bucket does not depend on the shard). A table
sharded across workers (`WorkerShardedTable`) gives every worker a copy, kept
equal by `apply_all`: the bucket sums of all workers reach every worker in
one gather, and every copy takes the step of one process on the global batch.

The rows are stored in the table's `value_dtype`; an optimizer step writes
compact rows rounded stochastically as the table's (`_rounding`), with the
bucket as the key, the fallback's update count as the step and the seed of
`<table>/fallback`. A slot the optimizer keeps per row is [buckets, 1].

Its state travels with the table's: `read_state` / `write_state` carry the
entries `fallback/values` ([buckets, dim], the storage dtype),
`fallback/slot/<name>` (float32 [buckets, dim or 1]) and `fallback/step`
(int64), so table checkpoints (full and delta saves hold the whole
fallback), `.keras` files and the exports see it; every save checks that
they are finite (`_check.verify_fallback`). A state without them restores
into a table with a fallback by resetting the fallback to its initial rows
(logged); a table without a fallback ignores them (logged). Rows saved in
another dtype round to nearest; slots saved in the other layout convert as
the table's (`_slot_layout`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._validation import ConfigError, check_int
from npu_rec.table import _check, _keyed_init, _row_init, _slot_layout
from npu_rec.table._rounding import RoundedRows, stochastic_round

#: What a not-yet-admitted key reads: the zero vector, or its fallback row.
NOT_ADMITTED = ("zeros", "hashed")
#: Prefix of the fallback's entries in a table's state.
PREFIX = "fallback/"
#: Mixed into the key before hashing, so that buckets do not follow the shards
#: (`_sharded.shard_of` hashes the bare key).
_SALT = 0x2545F4914F6CDD1D
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def validate(config) -> None:
    """Checks `not_admitted` and `fallback_buckets` of a `TableConfig` (normalising them).

    Raises:
      ConfigError: an unknown `not_admitted`, `fallback_buckets` < 1, or
        "hashed" without admission counting (`access_threshold` < 2: every key
        gets a row at its first sighting, so no training lookup would reach the
        fallback).
      ConfigTypeError: `fallback_buckets` is not an integer.
    """
    mode = config.not_admitted
    if mode not in NOT_ADMITTED:
        raise ConfigError(
            f"`not_admitted` must be one of {NOT_ADMITTED}. Received: not_admitted={mode!r}"
        )
    buckets = check_int(
        "fallback_buckets", config.fallback_buckets, 1, None, rule="an integer >= 1"
    )
    object.__setattr__(config, "fallback_buckets", buckets)
    if mode == "hashed" and config.access_threshold < 2:
        raise ConfigError(
            "not_admitted='hashed' needs admission that counts sightings: "
            "`access_threshold` must be >= 2 (below that every key gets its own row at "
            "its first training lookup, so the fallback would never be trained). "
            f"Received: not_admitted='hashed', access_threshold={config.access_threshold}"
        )


def bucket_of(keys: tf.Tensor, buckets: int) -> tf.Tensor:
    """int64 [n] fallback row of each int64 key: `splitmix64(key ^ salt) mod buckets`."""
    u = tf.uint64
    k = tf.bitwise.bitwise_xor(tf.bitcast(tf.cast(keys, tf.int64), u), tf.constant(_SALT, u))
    h = _keyed_init._splitmix64(k)
    return tf.cast(h % tf.constant(buckets, u), tf.int64)


def bucket_of_numpy(keys, buckets: int) -> np.ndarray:
    """NumPy twin of `bucket_of` (int64 [n] -> int64 [n])."""
    z = np.asarray(keys, np.int64).view(np.uint64) ^ np.uint64(_SALT)
    with np.errstate(over="ignore"):
        z = z + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(buckets)).astype(np.int64)


class _RoundedBuckets(RoundedRows):
    """The fallback's compact rows as an optimizer step writes them (`RoundedRows`).

    The rounding's key of fallback row `b` is `b` itself (the fallback's own
    seed keeps it apart from the table's key `b`).
    """

    def __init__(self, variable: tf.Variable, seed: int, step: tf.Tensor):
        self.storage = None
        self.variable = variable
        self.seed = seed
        self.step = step
        self.dtype = tf.float32
        self.shape = variable.shape

    def scatter_update(self, sparse_delta: tf.IndexedSlices) -> tf.Operation:
        rows = sparse_delta.indices
        stored = stochastic_round(
            sparse_delta.values, rows, self.step, self.seed, self.variable.dtype
        )
        return self.variable.scatter_update(tf.IndexedSlices(stored, rows))


class HashedFallback:
    """The fallback rows of one table, with their optimizer slots (see module docstring).

    Attributes:
      buckets: Rows of the fallback.
      values: [buckets, dim] variable in the table's `value_dtype`.
      slots: Slot name -> float32 [buckets, dim] variable (the table's optimizer's;
        [buckets, 1] for a slot it keeps per row).
      step: int64 scalar variable, the fallback's optimizer updates so far.
    """

    def __init__(self, table):
        config = table.config
        self.table_name = config.name
        self.dim = config.dim
        self.buckets = config.fallback_buckets
        self.initializer = config.initializer
        self.optimizer = config.optimizer
        self.value_dtype = tf.as_dtype(config.value_dtype)
        self.seed = _keyed_init.name_seed(config.name + "/fallback")
        self.graph_mode = table._graph_mode
        self.slots: dict[str, tf.Variable] = {}
        self.slot_dims: dict[str, int] = {}
        self._slot_init: dict[str, float] = {}
        self._graph_ops: dict = {}
        #: Creates plain variables where the table needs them (a worker-sharded table:
        #: not mirrored by the strategy; every worker keeps an equal copy).
        self._creation = getattr(table, "local_variables", contextlib.nullcontext)
        # In a graph, beside the table's first shard (on the parameter-server route,
        # on that ps task: every trainer shares it).
        self.device = table.shards[0].storage.values.device if self.graph_mode else None
        with (
            tf.init_scope(),
            self._creation(),
            tf.compat.v1.device(self.device),
            tf.name_scope(f"npu_rec_fallback_{config.name}"),
        ):
            self.values = tf.Variable(
                self.stored_initial_values, trainable=False, name="values", dtype=self.value_dtype
            )
            self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="step")
            if self.optimizer is not None:
                self._make_slots(self.optimizer)
            if self.graph_mode:
                self._graph_ops = self._build_graph_ops()

    # ------------------------------------------------------------------ state
    def initial_values(self) -> tf.Tensor:
        """float32 [buckets, dim]: the rows the fallback starts from (the table's initializer)."""
        if self.initializer is None:
            keys = tf.range(self.buckets, dtype=tf.int64)
            return _keyed_init.keyed_uniform(keys, self.dim, self.seed)
        return _row_init.initial_rows(self.initializer, self.buckets, self.dim, self.buckets)

    def stored_initial_values(self) -> tf.Tensor:
        """`initial_values` in the storage dtype (rounded to nearest, as a table's new rows)."""
        return tf.cast(self.initial_values(), self.value_dtype)

    def _make_slots(self, optimizer) -> None:
        row_slots = getattr(optimizer, "row_slots", ())
        for name, initial in optimizer.slot_specs:
            self._slot_init[name] = float(initial)
            width = self.slot_dims[name] = 1 if name in row_slots else self.dim
            self.slots[name] = tf.Variable(
                tf.fill([self.buckets, width], tf.constant(initial, tf.float32)),
                trainable=False,
                name=f"slot_{name}",
            )

    def bind_optimizer(self, optimizer) -> None:
        """Takes the optimizer bound to the table after creation and allocates its slots."""
        self.optimizer = optimizer
        with (
            tf.init_scope(),
            self._creation(),
            tf.compat.v1.device(self.device),
            tf.name_scope(f"npu_rec_fallback_{self.table_name}/"),
        ):
            self._make_slots(optimizer)
            if self.graph_mode:
                self._graph_ops = self._build_graph_ops()

    def variables(self) -> list[tf.Variable]:
        return [self.values, self.step, *self.slots.values()]

    def nbytes(self) -> int:
        """Bytes of the fallback's rows, slots and step counter."""
        return int(sum(v.shape.num_elements() * v.dtype.size for v in self.variables()))

    # ------------------------------------------------------------ lookups

    def rows_of(self, keys: tf.Tensor) -> tf.Tensor:
        """float32 [n, dim]: the fallback rows of int64 `keys` (their current values)."""
        return tf.cast(tf.gather(self.values, bucket_of(keys, self.buckets)), tf.float32)

    def fill(self, keys: tf.Tensor, rows: tf.Tensor, embeddings: tf.Tensor) -> tf.Tensor:
        """`embeddings` [u, dim] of unique `keys`, their fallback rows where `rows < 0`."""
        missing = (rows < 0)[:, None]
        out = tf.where(missing, tf.cast(self.rows_of(keys), embeddings.dtype), embeddings)
        # A lookup of a table sharded across workers marks its rows with the way their
        # gradients go back to the owners (`distribute._step_exchange.registered`); the
        # filled rows take that way too (an owner ignores the gradients of keys without
        # a row: those train the fallback).
        way_back = getattr(embeddings, "npu_rec_exchange", None)
        if way_back is not None:
            out.npu_rec_exchange = way_back
        return out

    def bucket_sums(self, keys: tf.Tensor, rows: tf.Tensor, grads: tf.Tensor):
        """(unique buckets int64 [k], summed float32 gradients [k, dim]) of the keys without a row.

        Args:
          keys: int64 [u] keys of a lookup (repeats allowed: several records).
          rows: int64 [u], their rows (< 0: no row, the fallback was read).
          grads: float32 [u, dim], d loss / d each key's embedding.
        """
        miss = tf.where(rows < 0)[:, 0]
        return sum_by_bucket(
            bucket_of(tf.gather(keys, miss), self.buckets),
            tf.gather(tf.cast(grads, tf.float32), miss),
        )

    def step_buckets(self, buckets: tf.Tensor, grads: tf.Tensor, condition=None) -> tf.Operation:
        """One optimizer step of the fallback rows `buckets` (unique) with summed `grads`.

        `condition` (a bool scalar, or None): step only if True.
        """

        def update():
            step = self.step.assign_add(1)
            values = self.values
            current = None
            if self.value_dtype != tf.float32:
                # Compact rows: the optimizer reads float32 and its writes round stochastically.
                values = _RoundedBuckets(self.values, self.seed, step)
                current = tf.cast(tf.gather(self.values, buckets), tf.float32)
            op = self.optimizer.apply_sparse(values, self.slots, buckets, grads, step, current)
            with tf.control_dependencies([step]):
                return tf.group(op)

        if condition is None:
            return update()

        def guarded():
            with tf.control_dependencies([update()]):
                return tf.constant(True)

        return tf.cond(condition, guarded, lambda: tf.constant(False))

    def apply(self, keys: tf.Tensor, rows: tf.Tensor, grads: tf.Tensor) -> tf.Operation:
        """One optimizer step of the fallback rows read by the keys without a row (one process).

        Arguments as `bucket_sums`.
        """
        return self.step_buckets(*self.bucket_sums(keys, rows, grads))

    # ------------------------------------------------------- state transfer
    def _build_graph_ops(self) -> dict:
        ph = tf.compat.v1.placeholder
        read = {
            f"{PREFIX}values": self.values.read_value(),
            f"{PREFIX}step": self.step.read_value(),
        }
        read.update({f"{PREFIX}slot/{n}": v.read_value() for n, v in self.slots.items()})
        feeds = {k: ph(t.dtype, t.shape, name=k.replace("/", "_")) for k, t in read.items()}
        assign = tf.group(*[self._var(k).assign(feeds[k], read_value=False) for k in feeds])
        return {"read": read, "load": (feeds, assign), "reset": self._reset_op()}

    def _var(self, key: str) -> tf.Variable:
        name = key[len(PREFIX) :]
        if name == "values":
            return self.values
        if name == "step":
            return self.step
        return self.slots[name[len("slot/") :]]

    def _reset_op(self) -> tf.Operation:
        ops = [self.values.assign(self.stored_initial_values(), read_value=False)]
        ops.append(self.step.assign(tf.constant(0, tf.int64), read_value=False))
        for name, var in self.slots.items():
            ops.append(var.assign(tf.fill(tf.shape(var), self._slot_init[name]), read_value=False))
        return tf.group(*ops)

    def read(self, session=None, check: bool = True) -> dict[str, np.ndarray]:
        """The fallback's entries of the table state, as NumPy (rows in the storage dtype).

        Raises:
          TableInvariantError: `check` and a fallback row or slot holds NaN or Inf.
        """
        if self.graph_mode:
            out = session.run(self._graph_ops["read"])
        else:
            # Copies: a variable's NumPy view would follow its later in-place updates.
            out = {f"{PREFIX}values": np.array(self.values.numpy())}
            out[f"{PREFIX}step"] = self.step.numpy()
            out.update({f"{PREFIX}slot/{n}": np.array(v.numpy()) for n, v in self.slots.items()})
        if check:
            _check.verify_fallback(self.table_name, out, PREFIX)
        return out

    def write(self, state: dict, session=None) -> None:
        """Loads the fallback entries of `state`, or resets the fallback when they do not fit.

        Rows saved in another dtype are converted (rounded to nearest); slots
        saved in the other layout (per element / per row) are converted or
        refused as the table's (`_slot_layout.fit_slots`).
        """
        key = f"{PREFIX}values"
        saved = np.asarray(state[key]) if key in state else None
        if saved is None or saved.shape != (self.buckets, self.dim) or f"{PREFIX}step" not in state:
            if not any(str(k).startswith(PREFIX) for k in state):
                why = "the state has no fallback rows (saved with not_admitted='zeros')"
            else:
                got = saved.shape if saved is not None else (0, 0)
                why = (
                    f"its fallback rows have shape {tuple(got)}, the table's "
                    f"{(self.buckets, self.dim)} (another fallback_buckets)"
                )
            logging.info(
                "npu_rec: table %r: %s; its fallback starts from its initial rows.",
                self.table_name,
                why,
            )
            if self.graph_mode:
                session.run(self._graph_ops["reset"])
            else:
                self._reset_op()
            return
        state = _slot_layout.fit_slots(
            self.table_name,
            state,
            self.slot_dims,
            self.dim,
            self.optimizer,
            rows=self.buckets,
            prefix=f"{PREFIX}slot/",
            what="fallback rows",
        )
        values = {
            key: saved.astype(self.value_dtype.as_numpy_dtype),  # rounded to nearest
            f"{PREFIX}step": np.asarray(state[f"{PREFIX}step"], np.int64),
        }
        values.update(
            {
                f"{PREFIX}slot/{n}": np.asarray(state[f"{PREFIX}slot/{n}"], np.float32)
                for n in self.slots
            }
        )
        if self.graph_mode:
            feeds, op = self._graph_ops["load"]
            session.run(op, {feeds[k]: v for k, v in values.items()})
        else:
            for k, v in values.items():
                self._var(k).assign(v)


def sum_by_bucket(buckets: tf.Tensor, grads: tf.Tensor):
    """(unique `buckets` int64 [k], `grads` [n, dim] summed per bucket [k, dim])."""
    uniq, idx = tf.unique(buckets, out_idx=tf.int64)
    return uniq, tf.math.unsorted_segment_sum(grads, idx, tf.size(uniq, out_type=tf.int64))


def attach(table) -> HashedFallback | None:
    """Gives `table` (as `create_table` made it) its fallback when its config asks for one.

    The table owns it (`table.fallback`); each shard admits new keys from it
    (`fallback_init`, read by `SingleShardTable.initial_values`).
    """
    if table.config.not_admitted != "hashed":
        return None
    fallback = HashedFallback(table)
    table.fallback = fallback
    for shard in table.shards:
        shard.fallback_init = fallback
    return fallback


def read_into(table, state: dict, session=None, check: bool = True) -> dict:
    """`state` (a table's `read_state`) with the table's fallback entries added.

    Raises:
      TableInvariantError: `check` and the fallback holds NaN or Inf.
    """
    if table.fallback is not None:
        sess = table._session(session) if table._graph_mode else None
        state.update(table.fallback.read(sess, check))
    return state


def write_from(table, state: dict, session=None) -> None:
    """Restores the fallback entries of `state` into `table` (see `HashedFallback.write`)."""
    if table.fallback is not None:
        table.fallback.write(state, table._session(session) if table._graph_mode else None)
    elif any(str(k).startswith(PREFIX) for k in state):
        logging.info(
            "npu_rec: table %r has not_admitted='zeros': the fallback rows in its state "
            "are not restored.",
            table.name,
        )


def fill(table, keys, rows, embeddings):
    """`embeddings` with the fallback rows of keys without a row, when `table` has a fallback."""
    fallback = getattr(table, "fallback", None)
    return embeddings if fallback is None else fallback.fill(keys, rows, embeddings)


def apply_all(items) -> tf.Operation:
    """One step of each fallback in `items`: `(table, keys, rows, grads)`, one per table.

    Arguments of each as `HashedFallback.bucket_sums`. The fallbacks of tables
    sharded across workers are copies, one per worker, that must take the
    same step: their bucket sums go to every worker in one gather for all of
    them (`table.gather_fallback_gradients`), and each worker sums them per
    bucket and steps its copy, so every copy equals the fallback one process
    trains on the global batch.
    """
    ops, together = [], []
    for table, keys, rows, grads in items:
        buckets, sums = table.fallback.bucket_sums(keys, rows, grads)
        if getattr(table, "gather_fallback_gradients", None) is None:
            ops.append(table.fallback.step_buckets(buckets, sums))
        else:
            together.append((table, buckets, sums))
    if together:
        gathered = together[0][0].gather_fallback_gradients([t[1:] for t in together])
        for (table, *_), (buckets, grads) in zip(together, gathered, strict=True):
            buckets, grads = sum_by_bucket(buckets, grads)
            ops.append(table.fallback.step_buckets(buckets, grads, table.update_condition()))
    return tf.group(*ops)
