"""Building one mode's graph and choosing what to restore into it.

An Estimator call builds a fresh `tf.compat.v1` graph: global step, input
pipeline, the user's `model_fn`, then a dense `Saver` over the non-table
variables and a `TableCheckpointManager` over the tables the `model_fn`
created. `RestorePlan` names the dense checkpoint and the table version to
load when the session is created (both at the same step).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec._rec_config import ConfigError
from npu_rec.checkpoint import TableCheckpointManager
from npu_rec.checkpoint._versions import Version, VersionLog, table_parts
from npu_rec.estimator._keras_names import fresh_layer_names
from npu_rec.estimator._spec import EstimatorSpec
from npu_rec.table import _registry as _table_registry

TABLES_SUBDIR = "tables"


class _DatasetInitHook(tf.compat.v1.train.SessionRunHook):
    """Runs a dataset iterator's initializer when the session is created."""

    def __init__(self, iterator):
        self._iterator = iterator

    def begin(self):
        self._init = self._iterator.initializer

    def after_create_session(self, session, coord):
        session.run(self._init)


def call_input_fn(input_fn, mode, params, config):
    """Calls `input_fn` (with the arguments it names) and returns (features, labels, hooks)."""
    names = inspect.signature(input_fn).parameters
    kwargs = {
        k: v for k, v in (("mode", mode), ("params", params), ("config", config)) if k in names
    }
    with tf.device("/cpu:0"):
        result = input_fn(**kwargs)
    hooks = []
    if isinstance(result, tf.data.Dataset):
        iterator = tf.compat.v1.data.make_initializable_iterator(result)
        hooks.append(_DatasetInitHook(iterator))
        result = iterator.get_next()
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise ValueError(
                "`input_fn` must return features, (features, labels) or a dataset "
                f"of them. Received a tuple of {len(result)} elements."
            )
        return result[0], result[1], hooks
    return result, None, hooks


def call_model_fn(model_fn, features, labels, mode, params, config) -> EstimatorSpec:
    """Calls `model_fn` with the arguments it names, Keras layer names fresh (`_keras_names`)."""
    names = inspect.signature(model_fn).parameters
    kwargs = {"features": features}
    if "labels" in names:
        kwargs["labels"] = labels
    for key, value in (("mode", mode), ("params", params), ("config", config)):
        if key in names:
            kwargs[key] = value
    with fresh_layer_names():
        spec = model_fn(**kwargs)
    if not isinstance(spec, EstimatorSpec):
        raise ValueError(
            "`model_fn` must return an npu_rec.estimator.EstimatorSpec. "
            f"Received: {type(spec).__name__}"
        )
    return spec


def batch_size_of(features) -> tf.Tensor:
    first = tf.nest.flatten(features)[0]
    if isinstance(first, (tf.SparseTensor, tf.RaggedTensor)):
        return tf.cast(first.shape[0] or tf.shape(first)[0], tf.int64)
    return tf.cast(tf.shape(first)[0], tf.int64)


def dense_saver(config) -> tuple[tf.compat.v1.train.Saver, TableCheckpointManager | None]:
    """The dense Saver (table variables excluded) and the table manager of this graph."""
    tables = _table_registry.tables()
    table_vars = {v.ref() for t in tables for v in t.variables()}
    dense = [v for v in tf.compat.v1.global_variables() if v.ref() not in table_vars]
    # Retention is the version log's (`keep_checkpoint_max` over every save in
    # model_dir); the Saver writes with write_state=False and deletes nothing.
    saver = tf.compat.v1.train.Saver(
        var_list=dense, max_to_keep=None, save_relative_paths=True, sharded=False
    )
    manager = None
    if tables:
        manager = TableCheckpointManager(os.path.join(config.model_dir, TABLES_SUBDIR), tables)
    return saver, manager


def checkpoint_step(path: str) -> int:
    """The global step saved in the dense checkpoint `path`.

    Raises:
      ValueError: the checkpoint has no `global_step` (a scaffold's Saver
        that leaves it out).
    """
    try:
        return int(tf.train.load_variable(path, "global_step"))
    except tf.errors.NotFoundError:
        raise ValueError(
            f"The checkpoint {path!r} has no `global_step`, so npu_rec cannot tell which "
            "table save belongs to it. A Saver given in EstimatorSpec(scaffold=...) must "
            "save tf.compat.v1.train.get_global_step() too."
        ) from None


def dense_prefix(version: Version) -> str | None:
    """`model.ckpt-<step>` of a version (relative), or None."""
    part = version.part("model.ckpt-")
    return None if part is None else re.sub(r"\.(index|data-\d+-of-\d+)$", "", part)


def latest_dense(model_dir: str) -> str | None:
    """The dense checkpoint prefix of the newest committed version of `model_dir`, or None."""
    log = VersionLog(model_dir)
    for version in reversed(log.versions()):
        prefix = dense_prefix(version)
        if prefix is not None:
            return os.path.join(model_dir, prefix)
    return None


def update_checkpoint_pointer(model_dir: str) -> None:
    """Points TensorFlow's `checkpoint` file at the committed dense checkpoints (newest last)."""
    prefixes = [p for p in (dense_prefix(v) for v in VersionLog(model_dir).versions()) if p]
    if not prefixes:
        return
    lines = [f"model_checkpoint_path: {json.dumps(prefixes[-1])}"] + [
        f"all_model_checkpoint_paths: {json.dumps(p)}" for p in prefixes
    ]
    path = os.path.join(model_dir, "checkpoint")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


@dataclasses.dataclass
class RestorePlan:
    """What a new session loads: `dense_path` (or None) and table `version` (or None)."""

    dense_path: str | None = None
    step: int = 0
    version: int | None = None
    from_restore_model_version: bool = False
    #: Table directory of a `checkpoint_path` outside `model_dir` (None: model_dir's).
    tables_dir: str | None = None
    #: The committed version restored (None: nothing, or a checkpoint outside a version log).
    committed: Version | None = None
    #: The table files to apply, in order (absolute paths).
    table_files: list[str] = dataclasses.field(default_factory=list)
    #: The data position file of the version, or None.
    position_path: str | None = None
    #: `WarmStartSettings` to initialise from (nothing restored from model_dir), or None.
    warm_start: object | None = None

    def init_fn(self, saver, manager):
        if manager is not None and self.tables_dir is not None and not self.table_files:
            raise ValueError(
                f"The checkpoint {self.dense_path!r} has no sparse-table save at step "
                f"{self.step} in {self.tables_dir!r}, but the model_fn creates tables "
                f"{sorted(t.name for t in manager.tables)}. Pass a checkpoint written by "
                "NPUEstimator (its directory holds `tables/`)."
            )

        def init(scaffold, session):
            del scaffold
            if self.dense_path is not None:
                saver.restore(session, self.dense_path)
            if manager is not None and self.table_files:
                manager.restore_files(self.table_files, session)

        return init


def _plan_for(directory: str, version: Version, chain: list[Version], **kwargs) -> RestorePlan:
    prefix = dense_prefix(version)
    position = version.part("data_position-")
    tables = [os.path.join(directory, p) for p in table_parts(chain)]
    logging.info("npu_rec: restoring step %d (dense %s, tables %s).", version.step, prefix, tables)
    return RestorePlan(
        None if prefix is None else os.path.join(directory, prefix),
        version.step,
        version.step if tables else None,
        committed=version,
        table_files=tables,
        position_path=None if position is None else os.path.join(directory, position),
        **kwargs,
    )


def plan_restore(
    model_dir: str,
    checkpoint_path: str | None = None,
    version: int | None = None,
    fallback: bool = True,
) -> RestorePlan:
    """Chooses the checkpoint: `version` (init's restore_model_version), a path, or the latest.

    The latest is the newest committed version of `model_dir` whose files all
    verify (damaged newer ones are skipped with a WARNING, or raise when
    `fallback` is False; docs/design.md, "Committed versions"). A
    `checkpoint_path` in another directory restores that directory's tables
    (`<dir>/tables`); when it has none at the checkpoint's step, the session
    creation raises (`RestorePlan.init_fn`) if the model_fn creates tables.

    Raises:
      npu_rec.ConfigError: `version` names no saved version (lists those that exist).
      npu_rec.checkpoint.CheckpointCorruptedError: a damaged version and no fallback.
    """
    log = VersionLog(model_dir)
    if version is not None:
        try:
            found, chain = log.select(version)
        except LookupError:
            found = log.versions()
            dense = sorted({v.step for v in found if dense_prefix(v)})
            tables = sorted({v.step for v in found if table_parts([v])})
            raise ConfigError(
                f"`npu_rec.init(restore_model_version={version})` names no saved version in "
                f"{model_dir!r}. Existing versions: dense {dense}, tables {tables}."
            ) from None
        return _plan_for(model_dir, found, chain, from_restore_model_version=True)
    if checkpoint_path is None:
        found, chain = log.select(fallback=fallback)
        return RestorePlan() if found is None else _plan_for(model_dir, found, chain)
    path = checkpoint_path
    if os.path.isdir(path):
        path = latest_dense(path) or tf.train.latest_checkpoint(path)
    if path is None:
        return RestorePlan()
    directory = os.path.dirname(os.path.abspath(path))
    other = VersionLog(directory)
    for v in reversed(other.versions()):
        if dense_prefix(v) == os.path.basename(path):
            chain = other.chain(v)
            other.verify(chain)
            external = directory != os.path.abspath(model_dir)
            return _plan_for(
                directory,
                v,
                chain,
                tables_dir=os.path.join(directory, TABLES_SUBDIR) if external else None,
            )
    step = checkpoint_step(path)
    return RestorePlan(path, step, None, tables_dir=os.path.join(directory, TABLES_SUBDIR))
