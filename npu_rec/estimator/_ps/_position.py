"""Each trainer's reading position on the ps route, committed with the chief's checkpoints.

Every trainer (the chief and each worker) reads its own share of an
`npu_rec.data.as_input_fn` source. Its position is a string variable on a ps
task (`TrainerPositions`, one per trainer, the same graph on every task)
holding the JSON source state after the last batch whose updates it has
applied: the trainer's training op assigns it in the same run, after that
batch's updates (`TrainerPositionHook.advance`; a `py_func` on the trainer
reads the state from the dataset's `ReadingPosition`, tf.data's read-ahead
excluded).

The chief's checkpoint runs with the workers paused (`_pause`: each worker
acknowledges after the run of its current step and waits until the save is
done). It reads all trainers' positions, then the dense variables, then the
tables, and commits the positions as `data_position-<step>.json`
(`{"trainers": {"chief:0": state, "worker:0": state, ...}}`, sealed, one
part of the version, written by the one-process machinery of
`npu_rec.training._data_position`). On resume the chief loads the file of the
version it restored into the variables before the workers may start; each
trainer then puts its source at its own state before its dataset reads
(`after_create_session`, before the iterator is initialised).

What this guarantees: no trainer applies an update during a save (the chief
saves between its own steps, the workers are paused between theirs), so a
checkpoint's model state holds exactly the batches its positions count, each
whole (on every table shard). A resume from it trains every sample exactly
once: none lost, none repeated.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.estimator._data_position_hook import path_for
from npu_rec.training._data_position import load_position, restore_source, save_position

_PREFIX = "npu_rec_data_position"
_KEY = "trainers"


def trainer_names(cluster_spec: tf.train.ClusterSpec) -> list[str]:
    """`"chief:0"`, `"worker:0"`, ...: every task that trains, in a fixed order."""
    jobs = cluster_spec.as_dict()
    return [f"{job}:{i}" for job in ("chief", "worker") for i in range(len(jobs.get(job, [])))]


class TrainerPositions:
    """The position variables of all trainers (made in the training graph, not saved by a Saver).

    Args:
      names: `trainer_names(...)`.
    """

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.variables, feeds, loads = {}, {}, []
        for name in self.names:
            suffix = name.replace(":", "_")
            var = tf.compat.v1.Variable(
                "",
                trainable=False,
                name=f"{_PREFIX}_{suffix}",
                collections=[],
                use_resource=True,
            )
            feeds[name] = tf.compat.v1.placeholder(tf.string, [], name=f"{_PREFIX}_{suffix}_load")
            loads.append(var.assign(feeds[name], read_value=False))
            self.variables[name] = var
        self._feeds = feeds
        self._load = tf.group(loads)
        self._read = {name: var.read_value() for name, var in self.variables.items()}

    def load(self, session, states: dict) -> None:
        """Sets every trainer's position (`states[name]`: a source state, absent or None: none)."""
        feed = {}
        for name in self.names:
            state = states.get(name)
            feed[self._feeds[name]] = "" if state is None else json.dumps(state)
        session.run(self._load, feed)

    def read(self, session) -> dict:
        """`{name: source state or None}` of every trainer, read in one run."""
        texts = session.run(self._read)
        return {n: json.loads(t) if t else None for n, t in texts.items()}


def committed_states(path: str | None) -> dict:
    """The trainers' states in a version's `data_position-<step>.json` ({} when none)."""
    if path is None or not os.path.exists(path):
        return {}
    payload = load_position(path)
    if _KEY not in payload:
        logging.warning(
            "npu_rec: %s holds one process's data position, not one per trainer; "
            "every trainer reads its share from where its source is.",
            path,
        )
        return {}
    return payload[_KEY]


class TrainerPositionHook(tf.compat.v1.train.SessionRunHook):
    """One trainer's reading position: restored at session start, advanced by its training op.

    Must run its `after_create_session` before the dataset's iterator is
    initialised (place it before the input function's hooks).

    Args:
      positions: The graph's `TrainerPositions`.
      name: This trainer (`"worker:1"`).
      source: The input function's source (`input_fn.source`).
      position: Its `ReadingPosition` (`input_fn.reading_position`).
      model_dir: Where the chief's `save(step)` writes.
    """

    def __init__(self, positions: TrainerPositions, name: str, source, position, model_dir: str):
        self.positions, self.name = positions, name
        job, index = name.split(":")
        self.device = f"/job:{job}/task:{index}"
        self.source, self.position, self.model_dir = source, position, model_dir
        self._start = self._consumed = 0
        self._session = None

    def advance(self, train_op):
        """`train_op`, then this trainer's position set to the state after the batch it trained."""
        # The py_func runs in this trainer's process (its own device), the assign on the ps task.
        with tf.control_dependencies([train_op]), tf.compat.v1.device(self.device):
            state = tf.compat.v1.py_func(self._next_state, [], tf.string, stateful=True)
        with tf.control_dependencies([train_op]):
            return self.positions.variables[self.name].assign(state, read_value=False)

    def _next_state(self) -> bytes:
        self._consumed += 1
        return json.dumps(self.position.state_after(self._start + self._consumed)).encode()

    def after_create_session(self, session, coord):
        self._session = session
        state = self.positions.read(session)[self.name]
        if state is not None:
            restore_source(
                self.source, state, int(session.run(tf.compat.v1.train.get_global_step()))
            )
        self._start, self._consumed = self.position.produced, 0

    def save(self, step: int) -> str:
        """The chief: writes every trainer's position as part of version `step`; returns the file."""
        path = path_for(self.model_dir, step)
        save_position(path, {_KEY: self.positions.read(self._session)})
        return path
