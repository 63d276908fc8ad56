"""`SparseCheckpoint`: full and delta table checkpoints with the dense state, and resume."""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Callable

import keras
import numpy as np

from npu_rec import _log as logging
from npu_rec import distribute
from npu_rec._paths import atomic_file
from npu_rec._rec_config import ConfigError, check_int, get_config
from npu_rec.checkpoint import CheckpointCorruptedError, TableCheckpointManager
from npu_rec.checkpoint._training_dir import TrainingDir
from npu_rec.checkpoint._versions import Version, table_parts
from npu_rec.data._source import tell_committed
from npu_rec.distribute import _worker_versions
from npu_rec.distribute._agreement import agree_max
from npu_rec.keras import _keras_fixes
from npu_rec.keras._finite import check_finite_state
from npu_rec.keras.callbacks._common import (
    global_step,
    in_online_training,
    set_global_step,
    tables_of,
)
from npu_rec.training._data_position import ConsumedBatches, load_position, save_position
from npu_rec.training._policies import DELTA, FULL, SavePolicy
from npu_rec.training._step_rules import check_keras_fit

_KINDS = (None, DELTA, FULL)  # agreed between workers as the largest index


class SparseCheckpoint(keras.callbacks.Callback):
    """Saves the sparse tables (full and delta) with the dense state; resumes from them.

    After every training call the shared `SavePolicy` (built from
    `npu_rec.get_config()`: `save_steps`, or `save_freq` here, plus the timed
    full/delta saves of `is_incremental_checkpoint`) decides what to save.
    A version `<step>` is written as:

    * `dense-<step>.npz`: the model's weights, the optimizer's variables and
      the global step;
    * `state-<step>.json`: the data source's reading position, if any (with a
      SHA-256 of its content);
    * `tables/ckpt-<step>.<full|delta>.nrc`: the tables
      (`npu_rec.checkpoint.TableCheckpointManager`);
    * `commits/version-<seq>.json`: the commit record, written last, once every
      part above is on disk (docs/design.md, "Committed versions"): a version
      exists only once it is committed.

    Under `MultiWorkerMirroredStrategy` (tables sharded across `W` workers),
    give every worker the same `directory` (storage every worker sees): worker
    `r` writes and commits its keys, the dense state and its data position in
    `directory/worker-<r>-of-<W>/`, at the same steps as the others (time
    cadences are agreed between the workers). A `directory` that already ends
    in this worker's `worker-<r>-of-<W>` is taken as that subdirectory. A version is restored only when
    every worker committed it. A checkpoint restores on any number of workers
    or in one process, each key going to its new owner (docs/distributed.md);
    the data position restores only on the same number of workers.

    Training end writes a full save unless the last step was just saved.
    At train start, with `restore=True` (or `restore=None` and
    `npu_rec.init(if_load=True)`), the version `init(restore_model_version)`
    (default the newest committed one that verifies; damaged newer ones are
    skipped with a WARNING) is restored: tables (its full save plus the deltas
    up to it), dense weights, optimizer, global step and data position. A
    `restore_model_version` that names no committed version raises
    `npu_rec.ConfigError`, in an empty directory too.
    Training holds the directory's lock (a second trainer fails at once) and
    moves aside versions saved after the restored one (a rollback).

    Args:
      directory: Checkpoint directory (created if missing).
      save_freq: Steps between full saves; None = `init(save_steps)`. Checked
        against `init(save_steps)` (they must agree when both are set).
      data_source: Optional object with `get_checkpoint_state() -> dict` and
        `restore_from_checkpoint(dict)` (an `npu_rec.data.MinibatchSource`).
      reading_position: The `reading_position` of the `npu_rec.data.as_dataset`
        dataset being trained on (`ds.reading_position`). tf.data reads ahead,
        so the source's own state is ahead of training: with it, the saved
        position is the state after the last batch the model consumed, so a
        resumed run continues at the first unconsumed sample (none lost, none
        repeated). With `data_source` too, each later `fit`/`online_train`
        call with this callback first rewinds the source to the consumed
        position (the batches the previous call read ahead are read again,
        not skipped). Without it the source's `get_checkpoint_state()` is saved.
      restore: True / False / None (follow `init(if_load)`).
      tables: Tables to checkpoint; default the model's.
      clock: Time source of the timed saves (default `time.monotonic`).
      keep_checkpoint_max: Versions kept in `directory` (int >= 0; 0 = all), as
        `NPURunConfig.keep_checkpoint_max`: every save in the directory counts,
        across training calls and processes; old full saves go with the deltas
        that depend on them, never what a kept version needs.
      checkpoint_fallback: When the newest version is damaged, restore the
        newest older complete one with a WARNING (True), or raise
        `CheckpointCorruptedError` (False).

    Attributes:
      saves: `(step, kind)` of every save of this callback, in order.
      restored_step: The step restored at start, or None.

    Example:
      >>> npu_rec.init(save_steps=100)
      >>> model.fit(ds, epochs=1, steps_per_epoch=300, callbacks=[SparseCheckpoint("/ckpt")])
    """

    def __init__(
        self,
        directory: str,
        save_freq: int | None = None,
        *,
        data_source=None,
        reading_position=None,
        restore: bool | None = None,
        tables=None,
        clock: Callable[[], float] = time.monotonic,
        keep_checkpoint_max: int = 0,
        checkpoint_fallback: bool = True,
    ):
        super().__init__()
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise ValueError(f"`directory` must be a path. Received: directory={directory!r}")
        if save_freq is not None and (
            isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1
        ):
            raise ValueError(
                f"`save_freq` must be None or an integer >= 1. Received: save_freq={save_freq!r}"
            )
        if restore not in (None, True, False):
            raise ValueError(
                f"`restore` must be None, True or False. Received: restore={restore!r}"
            )
        self.keep_checkpoint_max = check_int("keep_checkpoint_max", keep_checkpoint_max, 0)
        if not isinstance(checkpoint_fallback, bool):
            raise ValueError(
                "`checkpoint_fallback` must be True or False. Received: "
                f"checkpoint_fallback={checkpoint_fallback!r}"
            )
        self.checkpoint_fallback = checkpoint_fallback
        self.directory = str(directory)
        self.save_freq = save_freq
        self.data_source = data_source
        self.reading_position = reading_position
        self._start_step = 0
        self._consumed = None  # ConsumedBatches of `reading_position` (see `_begin_data`)
        self._start_state = None  # the data state when this call began
        self._consumed_state = None  # the data state after the last consumed batch
        self.restore = restore
        self._tables = tables
        self._clock = clock
        self.saves: list[tuple[int, str]] = []
        self.restored_step: int | None = None
        self._manager: TableCheckpointManager | None = None
        self._prepared_for = None
        self._restored: Version | None = None  # the version the model's state is at
        self._restored_model = None
        self._tdir: TrainingDir | None = None
        self.policy: SavePolicy | None = None
        self._loads_at_save = None  # model.table_state_loads at the delta base
        self._start_reason: str | None = None  # why training does not continue a version here

    # ---------------------------------------------------------------- helpers
    def _workers(self) -> tuple[int, int]:
        """(this worker's rank, workers) of the model's strategy; (0, 1) in one process."""
        strategy = self.model.distribute_strategy
        if not _keras_fixes.multi_worker(strategy):
            return 0, 1
        return distribute.worker_rank(strategy), strategy.num_replicas_in_sync

    @property
    def root_directory(self) -> str:
        """The directory of every worker's versions: `directory`, or its parent when
        `directory` is already this worker's `worker-<rank>-of-<W>` subdirectory."""
        rank, workers = self._workers()
        path = os.path.normpath(self.directory)
        if workers > 1 and os.path.basename(path) == f"worker-{rank}-of-{workers}":
            return os.path.dirname(path)
        return self.directory

    @property
    def own_directory(self) -> str:
        """Where this process writes: `directory`, or `<root>/worker-<rank>-of-<W>`."""
        return _worker_versions.worker_subdir(self.root_directory, *self._workers())

    def manager(self) -> TableCheckpointManager:
        if self._manager is None:
            self._manager = TableCheckpointManager(
                os.path.join(self.own_directory, "tables"), tables_of(self.model, self._tables)
            )
        return self._manager

    def _dense_path(self, step: int) -> str:
        return os.path.join(self.own_directory, f"dense-{step:012d}.npz")

    def _state_path(self, step: int) -> str:
        return os.path.join(self.own_directory, f"state-{step:012d}.json")

    def prepare(self, model) -> int | None:
        """Restores `model` if asked (once per model); returns the step restored or None.

        `RecModel.online_train` calls it before training, to know the step it
        resumes from; `on_train_begin` calls it otherwise. It only reads the
        directory; training takes the lock and cleans up (`on_train_begin`).
        """
        self.set_model(model)
        if self._prepared_for is model:
            return self.restored_step
        self._prepared_for = model
        self._manager = None
        if self._restored_model is not model:
            self._restored = None
            self._start_reason = None
        restore = get_config().if_load if self.restore is None else self.restore
        version = get_config().restore_model_version
        if restore and _worker_versions.has_versions(self.root_directory):
            self.restore_version(version)
        elif restore and version is not None:
            raise ConfigError(
                f"`npu_rec.init(restore_model_version={version})` names no saved version in "
                f"{self.root_directory!r}: the directory holds no committed version. Existing "
                "versions: []"
            )
        elif restore:
            logging.info("npu_rec: nothing to restore in %s; starting fresh.", self.directory)
        return self.restored_step

    def restore_version(self, version: int | None = None) -> int:
        """Restores tables, dense state and data position of `version` (default latest).

        Raises:
          npu_rec.ConfigError: `version` names no saved version.
          npu_rec.checkpoint.CheckpointCorruptedError: the version is damaged
            (an explicit one, or every one, or `checkpoint_fallback=False`);
            the message names the file.
        """
        try:
            group = _worker_versions.select(
                self.root_directory, version, fallback=self.checkpoint_fallback
            )
        except LookupError as err:
            raise ConfigError(f"`npu_rec.init(restore_model_version={version})`: {err}") from None
        if group is None:
            raise FileNotFoundError(f"No checkpoint in {self.directory!r}.")
        rank, workers = self._workers()
        same_layout = group.layout.dirs == tuple(
            _worker_versions.worker_subdir(self.root_directory, r, workers) for r in range(workers)
        )
        found = group.versions[rank] if same_layout else None
        if same_layout:
            chain = group.chains[rank]
            self.manager().restore_files(
                [os.path.join(self.own_directory, p) for p in table_parts(chain)]
            )
            self._start_reason = None
        else:  # re-shard: every worker's keys, each table keeps those it owns
            distribute.restore_chains(group.table_files(), tables_of(self.model, self._tables))
            self._manager = None  # no delta base in this layout: the next save is full
            self._start_reason = (
                f"training continues from step {group.step} of {group.layout.describe()}"
            )
            logging.info(
                "npu_rec: re-sharding %s onto %d worker(s).", group.layout.describe(), workers
            )
        self._loads_at_save = getattr(self.model, "table_state_loads", 0)
        step = group.step
        data = _load_npz(group.part(0, "dense-"))
        weights = self.model.weights
        for i, v in enumerate(weights):
            v.assign(data[f"w{i}"])
        opt = self.model.optimizer
        if opt is not None:
            if not opt.built:  # in the strategy's scope (multi-worker: mirrored slots)
                with self.model.distribute_strategy.scope():
                    opt.build(self.model.trainable_variables)
            for i, v in enumerate(opt.variables):
                if f"o{i}" in data:
                    v.assign(data[f"o{i}"])
        set_global_step(self.model, int(data["global_step"]))
        self._restore_data(group, rank if same_layout else None)
        self._restored, self._restored_model = found, self.model
        self.restored_step = step
        logging.info("npu_rec: restored checkpoint step %d from %s", step, self.directory)
        return step

    def _restore_data(self, group, rank: int | None) -> None:
        """The data position of worker `rank` of `group` (None: saved by other workers)."""
        if self.data_source is None:
            return
        if rank is None:
            logging.warning(
                "npu_rec: the data position of %s is not restored: it was saved by %d "
                "worker(s) reading their shares of the data, and this run has %d. The data "
                "source starts where it is.",
                group.layout.describe(),
                group.layout.workers,
                self._workers()[1],
            )
            return
        state_part = group.part(rank, "state-")
        if state_part is not None:
            state = load_position(state_part)
            if state.get("data") is not None:
                self.data_source.restore_from_checkpoint(state["data"])
                self._consumed_state = state["data"]

    def data_state(self, step: int | None = None) -> dict | None:
        """The data position after the batches trained up to `step` (JSON-able), or None."""
        step = global_step(self.model) if step is None else step
        if self.reading_position is not None:
            consumed = self._consumed_batches()
            if consumed.consumed(step) == 0 and self._start_state is not None:
                return self._start_state
            return consumed.state_at(step)
        if self.data_source is not None:
            return self.data_source.get_checkpoint_state()
        return None

    def _consumed_batches(self) -> ConsumedBatches:
        """The step -> data state map of `reading_position` (made anew if it was replaced)."""
        if self._consumed is None or self._consumed.position is not self.reading_position:
            self._consumed = ConsumedBatches(self.reading_position)
        return self._consumed

    def _begin_data(self) -> None:
        """Marks where this training call starts reading; rewinds a read-ahead source."""
        position, source = self.reading_position, self.data_source
        if position is None:
            return
        if source is not None:
            if self._consumed_state is not None:
                # The previous call's iterator (gone by now) read ahead of what was
                # trained: continue at the first batch the model did not consume.
                source.restore_from_checkpoint(self._consumed_state)
            self._start_state = source.get_checkpoint_state()
        else:
            self._start_state = None
        self._consumed_batches().begin(self._start_step)

    def save(self, step: int | None = None, kind: str = FULL) -> str:
        """Writes and commits version `step` (default the global step); returns the table file.

        Every part is written and fsynced before the commit record; if any
        write raises (a full disk, a failed table check), the parts written so
        far are removed, nothing is published and the previous version stays
        the newest.

        Raises:
          ValueError: a dense weight or optimizer variable is not finite (nothing written).
        """
        check_finite_state(self.model, "SparseCheckpoint")
        step = global_step(self.model) if step is None else step
        loads = getattr(self.model, "table_state_loads", 0)
        if kind == DELTA and loads != self._loads_at_save:
            kind = FULL  # tables replaced (set_weights, load_weights) since the delta's base
        own = self._tdir is None
        tdir = self._open_for_training() if own else self._tdir
        try:
            path = self._write_version(tdir, step, kind)
            self._loads_at_save = loads  # the base of the next delta
            return path
        finally:
            if own:
                self._close()

    def _write_version(self, tdir: TrainingDir, step: int, kind: str) -> str:
        opt = self.model.optimizer
        arrays = {f"w{i}": np.asarray(v.numpy()) for i, v in enumerate(self.model.weights)}
        if opt is not None and opt.built:
            arrays.update({f"o{i}": np.asarray(v.numpy()) for i, v in enumerate(opt.variables)})
        arrays["global_step"] = np.asarray(step, np.int64)
        dense, state = self._dense_path(step), self._state_path(step)
        parts = [os.path.basename(dense), os.path.basename(state)]
        taken = sorted(set(parts) & tdir.log.owned())
        if taken:
            raise ValueError(
                f"Step {step} is already saved in {self.own_directory!r} ({taken}); "
                "a saved version is never overwritten."
            )
        try:
            with atomic_file(dense, "wb") as f:
                np.savez(f, **arrays)
            data = self.data_state(step)
            save_position(state, {"step": step, "kind": kind, "data": data})

            def commit(path):
                done = "delta" if path.endswith(".delta.nrc") else "full"
                parts.append(os.path.relpath(path, self.own_directory))
                self._restored = tdir.commit(step, done, parts)
                self._restored_model = self.model

            path = self.manager().save(step, delta=kind == DELTA, commit=commit)
        except BaseException:
            tdir.discard(parts)
            raise
        if self.data_source is not None and data is not None:
            tell_committed(self.data_source, data)  # e.g. a stream's offsets to its broker
        done = DELTA if path.endswith(".delta.nrc") else FULL  # a first delta becomes full
        if self.policy is not None:
            self.policy.mark_saved(done, step)
        self.saves.append((step, done))
        return path

    def _open_for_training(self) -> TrainingDir:
        """Locks the directory, cleans it, and continues from the restored version."""
        tdir = TrainingDir(self.own_directory, keep=self.keep_checkpoint_max).open()
        try:
            tdir.start_from(self._restored, None if self._restored else self._start_reason)
            if self._restored is not None and self.manager().base_step is None:
                tdir.parent = None  # no table base in this process: the next save is full
        except BaseException:
            tdir.close()
            raise
        return tdir

    def _close(self) -> None:
        if self._tdir is not None:
            self._tdir.close()
            self._tdir = None

    def release(self) -> None:
        """Releases the directory's training lock (after training stopped by an error)."""
        self._close()
        self._prepared_for = None

    # -------------------------------------------------------------- callbacks
    def on_train_begin(self, logs=None):
        online = in_online_training(self.model)
        steps = None if online else self.params.get("steps")
        resolved = check_keras_fit(
            epochs=1 if online else (self.params.get("epochs") or 1),
            steps_per_epoch=steps,
            save_freq=self.save_freq,
            callback_label="SparseCheckpoint",
        )
        self.prepare(self.model)
        self._close()
        self._tdir = self._open_for_training()
        self.policy = SavePolicy.from_config(
            get_config(), save_steps=resolved.save_steps, clock=self._clock
        )
        self._start_step = global_step(self.model)
        self._begin_data()
        self.policy.start(global_step(self.model), has_full_save=self._tdir.parent is not None)

    def on_train_batch_end(self, batch, logs=None):
        step = global_step(self.model)
        kind = self.policy.decide(step)
        if self.policy.incremental and self._workers()[1] > 1:
            # Time cadences read each worker's clock: save where any worker would.
            kind = _KINDS[agree_max(self.model.distribute_strategy, _KINDS.index(kind), 3)]
        if kind is not None:
            self.save(step, kind)

    def on_train_end(self, logs=None):
        step = global_step(self.model)
        if self._restored is None or self._restored.step != step:
            self.save(step, FULL)
        if self.reading_position is not None:
            self._consumed_state = self.data_state(step)
            self.reading_position.stop()  # a paused stream's pending read ends
        self._close()
        self._prepared_for = None


def _load_npz(path: str):
    """The arrays of a dense `.npz` part; a damaged file raises naming it."""
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise CheckpointCorruptedError(
            f"Checkpoint file {path!r} is corrupted (not a readable .npz: {err})."
        ) from None
