"""`tf.data` and Estimator adapters for minibatch sources, with consumed-position tracking.

tf.data reads ahead of the model (prefetch), so the source's own position is
ahead of what training has consumed. Every dataset made by `as_dataset` has a
`ReadingPosition` (`dataset.reading_position`, or the one passed in): the
reading thread records the source's checkpoint state after each batch it
produces, and the front end asks for the state after the batches the model
has actually consumed:

    position = ReadingPosition()
    ds = as_dataset(source, 512, position=position)
    ... train n steps on ds ...
    state = position.state_after(n)       # or: position.mark_consumed(); position.consumed_state()
    # save `state` (JSON) with the checkpoint; on resume:
    source.restore_from_checkpoint(state)  # then build the dataset again
"""

from __future__ import annotations

import collections
import logging
import threading

import numpy as np

from npu_rec.data._columns import Ragged
from npu_rec.data._source import MinibatchSource, check_sharding, tell_committed

_logger = logging.getLogger("npu_rec.data")

DEFAULT_PAD_LENGTH = 16
HISTORY = 4096


class ReadingPosition:
    """The source state after each batch a dataset has produced, by batch count.

    Thread-safe: the tf.data thread records, the training loop reads. Keeps the
    states of the last `history` batches (far more than any prefetch depth).

    Example:
      >>> pos = ReadingPosition()
      >>> ds = as_dataset(source, 256, position=pos)
      >>> for features, label in ds.take(3): ...
      >>> state = pos.state_after(3)   # what to save with a checkpoint
    """

    def __init__(self, history: int = HISTORY):
        self._lock = threading.Lock()
        self._states = collections.OrderedDict()
        self._history = int(history)
        self._produced = 0
        self._consumed = 0
        self._initial = None
        self._source = None  # the source recorded (set by `as_dataset`)
        self._stopped = False

    def start(self, state: dict) -> None:
        """Notes the state before the first batch (until a batch has been produced)."""
        with self._lock:
            if self._produced == 0:
                self._initial = state

    def record(self, state: dict) -> None:
        """Notes the state after one more batch (called by the dataset's generator)."""
        with self._lock:
            self._produced += 1
            self._states[self._produced] = state
            while len(self._states) > self._history:
                self._states.popitem(last=False)

    @property
    def produced(self) -> int:
        """Batches produced so far (read ahead included)."""
        return self._produced

    def state_after(self, num_batches: int) -> dict:
        """The source's checkpoint state after the first `num_batches` batches.

        Raises:
          ValueError: `num_batches` not produced yet, or too old to be kept.
        """
        with self._lock:
            if num_batches == 0 and self._initial is not None:
                return self._initial
            if num_batches not in self._states:
                raise ValueError(
                    "`num_batches` must be a produced batch count within the last "
                    f"{self._history}. Received: num_batches={num_batches} "
                    f"(produced {self._produced})"
                )
            return self._states[num_batches]

    def stop(self) -> None:
        """Lets the datasets recording here end while their stream pauses.

        A stream source returns an empty minibatch when no full batch arrived within
        its wait (`KafkaSource(max_wait_ms=...)`); the dataset then waits on. A
        tf.data iterator being deleted (training has ended) waits for its pending read,
        so the front ends call `stop()` when training ends: the pending read ends at
        the next pause. The next iteration of a dataset clears it.
        """
        self._stopped = True

    def checkpoint_committed(self, state: dict | None) -> None:
        """Tells the source that a checkpoint holding `state` is committed.

        The front ends call it after each committed save; a stream source then stores
        its offsets on the broker (`MinibatchSource.checkpoint_committed`).
        """
        if state is not None and self._source is not None:
            tell_committed(self._source, state)

    def mark_consumed(self, num_batches: int = 1) -> None:
        """Tells that the model has consumed `num_batches` more batches."""
        self._consumed += int(num_batches)

    @property
    def consumed(self) -> int:
        return self._consumed

    def consumed_state(self) -> dict:
        """The state after the batches marked consumed: save this with a checkpoint."""
        return self.state_after(self._consumed)


def _use_dynamic() -> bool:
    try:
        import npu_rec

        get = getattr(npu_rec, "get_config", None)
        if get is None:
            from npu_rec import _rec_config

            get = _rec_config.get_config
        return bool(get().use_dynamic)
    except Exception:  # config not built yet, or not initialised
        return True


def as_dataset(
    source: MinibatchSource,
    batch_size: int,
    *,
    number_of_workers: int = 1,
    worker_rank: int = 0,
    label: str | None = None,
    num_sweeps: int | None = 1,
    prefetch: int = 2,
    use_dynamic: bool | None = None,
    pad_length=None,
    position: ReadingPosition | None = None,
):
    """A `tf.data.Dataset` of `(features, label)` batches read from a source.

    Each batch is one `source.next_minibatch(batch_size, number_of_workers,
    worker_rank)`. Iterating the dataset (again) continues from the source's
    current position; each iteration covers `num_sweeps` sweeps.

    Args:
      source: a `MinibatchSource`.
      batch_size: samples per batch for this worker.
      number_of_workers: workers sharing the data.
      worker_rank: this worker.
      label: the label stream; default `source.label_name`.
      num_sweeps: sweeps per iteration; None for endless.
      prefetch: batches read ahead.
      use_dynamic: ragged, variable-size batches (True) or fixed shapes (False:
        the short last batch of a sweep is dropped, multi-valued streams are
        `tf.SparseTensor`s of dense shape `[batch, pad_length]`, truncated
        beyond `pad_length`; the absent entries are the padding, so no id
        value is reserved for it). Default: `npu_rec.get_config().use_dynamic`,
        or True before `npu_rec.init`.
      pad_length: fixed length of multi-valued streams (an int, or a dict by
        stream name); default `DEFAULT_PAD_LENGTH` (16).
      position: a `ReadingPosition` to record into; default a new one.

    Returns:
      A dataset of `(features, label)`: `features` maps stream names to
      `[batch]` float32/int64 tensors, or, for multi-valued streams,
      `[batch, None]` int64 `tf.RaggedTensor`s (dynamic) / int64
      `tf.SparseTensor`s of static dense shape `[batch, pad_length]` whose
      entries of row `i` are its first ids at columns `0 .. n_i - 1` (static;
      `sparse_lookup` and `SparseEmbedding` with a combiner take them, and
      `tf.sparse.to_dense(ids, default_value=PAD_ID)` makes a padded dense
      tensor); `label` is float32 `[batch]`. The `reading_position` attribute
      is the position.

    Raises:
      ValueError: at construction, for bad arguments. When iterated (wrapped by
        tf.data in `tf.errors.InvalidArgumentError`): a whole sweep gives this
        worker no batch (with fixed shapes, fewer rows than `batch_size`; in
        both modes, no rows), which would otherwise spin forever. The message
        names the rows, the batch size and the fix.
    """
    import tensorflow as tf

    b, w, r = check_sharding(batch_size, number_of_workers, worker_rank)
    label = label or getattr(source, "label_name", None)
    infos = source.stream_infos()
    if label not in [s.name for s in infos]:
        raise ValueError(f"`label` must name a stream of the source. Received: label={label!r}")
    if num_sweeps is not None and (isinstance(num_sweeps, bool) or int(num_sweeps) < 1):
        raise ValueError(f"`num_sweeps` must be None or >= 1. Received: num_sweeps={num_sweeps!r}")
    dynamic = _use_dynamic() if use_dynamic is None else bool(use_dynamic)
    position = position if position is not None else ReadingPosition()
    position._source = source
    lengths = {}
    for s in infos:
        if s.storage_format == "ragged":
            n = (
                pad_length.get(s.name, DEFAULT_PAD_LENGTH)
                if isinstance(pad_length, dict)
                else (pad_length or DEFAULT_PAD_LENGTH)
            )
            lengths[s.name] = int(n)
    batch_dim = None if dynamic else b

    def spec(s):
        if s.storage_format == "ragged":
            if dynamic:
                return tf.RaggedTensorSpec(
                    [None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64
                )
            return tf.SparseTensorSpec([batch_dim, lengths[s.name]], tf.int64)
        return tf.TensorSpec([batch_dim], tf.as_dtype(s.dtype))

    features_spec = {s.name: spec(s) for s in infos if s.name != label}
    label_spec = tf.TensorSpec([batch_dim], tf.float32)

    def generate():
        start = source.get_checkpoint_state()
        position.start(start)
        position._stopped = False
        sweeps = 0
        # This worker's rows and batches in the current sweep, counted only over a whole
        # sweep (one read from its start): one that yields no batch would spin forever.
        whole = isinstance(start, dict) and start.get("position") == 0
        rows = batches = 0
        while num_sweeps is None or sweeps < num_sweeps:
            mb = source.next_minibatch(b, w, r)
            any_data = next(iter(mb.values()))
            n, end = any_data.num_samples, any_data.sweep_end
            sweeps += int(end)
            rows += n
            if n == 0 and not end and position._stopped:
                return  # a paused stream, and training has ended (ReadingPosition.stop)
            if n == 0 or (not dynamic and n < b):
                if end and whole and batches == 0:
                    raise ValueError(_no_batch_message(source, rows, b, w, r, dynamic))
                if end:
                    whole, rows, batches = True, 0, 0
                continue
            batches += 1
            if end:
                whole, rows, batches = True, 0, 0
            position.record(source.get_checkpoint_state())
            feats = {}
            for s, d in mb.items():
                if s.name == label:
                    continue
                if s.storage_format == "ragged" and not dynamic:
                    feats[s.name] = _truncated(d.data, lengths[s.name], s.name)
                else:
                    feats[s.name] = d.data
            yield feats, np.asarray(mb[source.stream(label)].data, np.float32)

    position.start(source.get_checkpoint_state())
    ds = tf.data.Dataset.from_generator(generate, output_signature=(features_spec, label_spec))
    ds = ds.prefetch(prefetch)
    ds.reading_position = position
    return ds


def _no_batch_message(source, rows: int, b: int, w: int, r: int, dynamic: bool) -> str:
    who = f"worker {r} of {w}" if w > 1 else "it"
    head = f"as_dataset: one sweep of {type(source).__name__} gives {who} {rows} rows"
    if dynamic:
        return (
            f"{head}, so no batch would ever be produced. Use fewer workers "
            f"(number_of_workers={w}) or more data."
        )
    return (
        f"{head}, fewer than batch_size={b}; with fixed shapes (use_dynamic=False) the short "
        "last batch of a sweep is dropped, so no batch would ever be produced. Use "
        f"batch_size <= {rows} or use_dynamic=True (short batches are kept)."
    )


_warned = set()


def _truncated(ragged, length: int, name: str):
    """Ragged ids [batch, (k)] as a `tf.SparseTensor` [batch, length], each row cut to `length`."""
    import tensorflow as tf

    values, splits = ragged.values.numpy(), ragged.row_splits.numpy()
    col = Ragged(values, splits)
    lens = np.diff(col.splits)
    if (lens > length).any() and name not in _warned:
        _warned.add(name)
        _logger.warning("Truncating multi-valued stream %r to pad_length=%d ids", name, length)
    pos = np.arange(len(values)) - np.repeat(splits[:-1], lens)
    rows = np.repeat(np.arange(len(lens)), lens)
    keep = pos < length
    indices = np.stack([rows[keep], pos[keep]], axis=1).astype(np.int64).reshape(-1, 2)
    return tf.SparseTensor(indices, np.asarray(values[keep], np.int64), [len(lens), length])


def as_input_fn(source: MinibatchSource, batch_size: int, **kwargs):
    """An Estimator `input_fn` returning `as_dataset(source, batch_size, **kwargs)`.

    Each call builds a dataset that continues from the source's current
    position. `input_fn.reading_position` is the `ReadingPosition` shared by
    every dataset it builds and `input_fn.source` the source; a front end saves
    `state_after(steps since the dataset was built)` / `consumed_state()` with
    each checkpoint (`NPUEstimator.train` does) and restores the source on resume.

    Args:
      source: a `MinibatchSource`.
      batch_size: samples per batch for this worker.
      **kwargs: further `as_dataset` arguments (number_of_workers, worker_rank, ...).

    Returns:
      `input_fn(params=None, config=None)` -> `tf.data.Dataset` of `(features, label)`.
    """
    position = kwargs.pop("position", None) or ReadingPosition()

    def input_fn(params=None, config=None):
        return as_dataset(source, batch_size, position=position, **kwargs)

    input_fn.reading_position = position
    input_fn.source = source
    return input_fn
