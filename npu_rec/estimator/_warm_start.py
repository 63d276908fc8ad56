"""`WarmStartSettings` and `VocabInfo`: initialising a new model from another one's checkpoint.

As tf.estimator: `Estimator(warm_start_from=...)` takes a checkpoint path, a
directory of checkpoints, a SavedModel directory, or `WarmStartSettings`;
a path means `WarmStartSettings(path)`, which warm-starts every trainable
variable (`vars_to_warm_start=".*"`). In every mode, while `model_dir` has no
checkpoint (and no `checkpoint_path` is given), the variables chosen are
initialised from the source (`tf.compat.v1.train.warm_start`: renamed by
`var_name_to_prev_var_name`, vocabulary-remapped by `var_name_to_vocab_info`)
and the others as the model_fn says. npu_rec's sparse tables are not
warm-started: they start empty, as in a fresh model_dir.
"""

from __future__ import annotations

import collections
import os

import tensorflow as tf

from npu_rec import _log as logging
from npu_rec.table import _registry as _table_registry

#: `tf.compat.v1.train.VocabInfo`: how a vocabulary-indexed variable maps onto the source's.
VocabInfo = tf.compat.v1.train.VocabInfo


class WarmStartSettings(
    collections.namedtuple(
        "WarmStartSettings",
        [
            "ckpt_to_initialize_from",
            "vars_to_warm_start",
            "var_name_to_vocab_info",
            "var_name_to_prev_var_name",
        ],
    )
):
    """What to warm-start from, and which variables.

    Args:
      ckpt_to_initialize_from: A checkpoint path or a directory of checkpoints.
      vars_to_warm_start: A regular expression over the trainable variables
        (default ".*": all of them), a list of regular expressions over all
        global variables, a list of variables, or None (none).
      var_name_to_vocab_info: dict variable name -> `VocabInfo` for
        vocabulary-indexed variables (embeddings of vocabulary feature columns)
        whose vocabulary changed.
      var_name_to_prev_var_name: dict variable name -> its name in the source.

    Raises:
      ValueError: `ckpt_to_initialize_from` is empty.

    Example:
      >>> E.WarmStartSettings("/tmp/old_model", vars_to_warm_start=".*dense.*")
    """

    def __new__(
        cls,
        ckpt_to_initialize_from,
        vars_to_warm_start=".*",
        var_name_to_vocab_info=None,
        var_name_to_prev_var_name=None,
    ):
        if not ckpt_to_initialize_from:
            raise ValueError(
                "`ckpt_to_initialize_from` must be a checkpoint path or directory. "
                f"Received: {ckpt_to_initialize_from!r}"
            )
        return super().__new__(
            cls,
            os.fspath(ckpt_to_initialize_from),
            vars_to_warm_start,
            var_name_to_vocab_info or {},
            var_name_to_prev_var_name or {},
        )


def warm_start_settings(warm_start_from) -> WarmStartSettings | None:
    """`warm_start_from` as `WarmStartSettings` (None stays None).

    Raises:
      ValueError: something that is neither a path nor `WarmStartSettings`.
    """
    if warm_start_from is None or isinstance(warm_start_from, WarmStartSettings):
        return warm_start_from
    if not isinstance(warm_start_from, (str, bytes, os.PathLike)):
        raise ValueError(
            "`warm_start_from` must be a checkpoint path, a directory or WarmStartSettings. "
            f"Received: {warm_start_from!r}"
        )
    path = os.fsdecode(warm_start_from)
    saved_model_variables = os.path.join(path, "variables", "variables")
    if tf.io.gfile.exists(saved_model_variables + ".index"):
        logging.info("npu_rec: warm-starting from the SavedModel %s", path)
        path = saved_model_variables
    return WarmStartSettings(path)


def source_checkpoint(settings: WarmStartSettings) -> str:
    """The checkpoint prefix `settings` warm-start from.

    Raises:
      ValueError: a directory without checkpoints.
    """
    path = settings.ckpt_to_initialize_from
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"`warm_start_from` directory {path!r} holds no checkpoint.")
        return latest
    return path


def _chosen_variables(selection) -> list:
    """The variables `vars_to_warm_start` names, as tf.compat.v1.train.warm_start reads it."""
    if selection is None:
        return []
    if isinstance(selection, str):
        return tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, selection)
    selection = list(selection)
    if all(isinstance(s, str) for s in selection):
        chosen = []
        for pattern in selection:
            for v in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, pattern):
                if v not in chosen:
                    chosen.append(v)
        return chosen
    return selection


def apply(settings: WarmStartSettings) -> None:
    """Sets the initialisers of the current graph's chosen variables to the source's values.

    Raises:
      ValueError: (from TensorFlow) a chosen variable missing from the source
        or of another shape.
    """
    tables = {v.ref() for t in _table_registry.tables() for v in t.variables()}
    chosen = [v for v in _chosen_variables(settings.vars_to_warm_start) if v.ref() not in tables]
    if not chosen:
        logging.warning("npu_rec: warm start chose no variable (%s).", settings)
        return
    tf.compat.v1.train.warm_start(
        source_checkpoint(settings),
        vars_to_warm_start=chosen,
        var_name_to_vocab_info=dict(settings.var_name_to_vocab_info),
        var_name_to_prev_var_name=dict(settings.var_name_to_prev_var_name),
    )
