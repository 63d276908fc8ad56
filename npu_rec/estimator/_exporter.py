"""`Exporter`s of `EvalSpec(exporters=...)`: what `train_and_evaluate` exports after an evaluation.

As tf.estimator's: after each evaluation, `train_and_evaluate` calls every
exporter's `export(estimator, export_path, checkpoint_path, eval_result,
is_the_final_export)` with `export_path = model_dir/export/<exporter name>`;
the exporter writes (or skips) a SavedModel there with
`Estimator.export_saved_model` and returns its path (bytes) or None.

- `LatestExporter` exports after every evaluation, keeping the newest
  `exports_to_keep`.
- `BestExporter` exports when `compare_fn(best_eval_result=...,
  current_eval_result=...)` says the evaluation is better than the best so far
  (the best is read back from the evaluation event files, so a restarted run
  remembers it; the first evaluation of an exporter always exports).
- `FinalExporter` exports once, at the evaluation of training's last
  checkpoint (`global_step >= TrainSpec.max_steps`; never when
  `max_steps` is None, as in tf.estimator).
"""

from __future__ import annotations

import glob
import inspect
import os
import shutil

import tensorflow as tf

from npu_rec import _log as logging


class Exporter:
    """A kind of export run after each evaluation of `train_and_evaluate`.

    Subclasses define `name` (the directory under `model_dir/export`) and
    `export(estimator, export_path, checkpoint_path, eval_result,
    is_the_final_export)` returning the export's path or None.
    """

    @property
    def name(self) -> str:
        raise NotImplementedError

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        raise NotImplementedError


class _SavedModelExporter(Exporter):
    """Exports the serving graph of a checkpoint with `Estimator.export_saved_model`."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        self._name = name
        self._serving_input_receiver_fn = serving_input_receiver_fn
        self._assets_extra = assets_extra
        self._as_text = as_text

    @property
    def name(self) -> str:
        return self._name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        return estimator.export_saved_model(
            export_path,
            self._serving_input_receiver_fn,
            assets_extra=self._assets_extra,
            as_text=self._as_text,
            checkpoint_path=checkpoint_path,
        )


def _check_keep(exports_to_keep):
    if exports_to_keep is not None and (
        isinstance(exports_to_keep, bool)
        or not isinstance(exports_to_keep, int)
        or exports_to_keep <= 0
    ):
        raise ValueError(
            "`exports_to_keep` must be a positive int or None (keep all). "
            f"Received: exports_to_keep={exports_to_keep!r}"
        )
    return exports_to_keep


def _keep_newest(export_dir_base: str, exports_to_keep) -> None:
    """Deletes all but the `exports_to_keep` newest `<timestamp>` exports of a directory."""
    if exports_to_keep is None or not os.path.isdir(export_dir_base):
        return
    versions = sorted(int(n) for n in os.listdir(export_dir_base) if len(n) == 10 and n.isdigit())
    for version in versions[:-exports_to_keep]:
        shutil.rmtree(os.path.join(export_dir_base, str(version)), ignore_errors=True)


class LatestExporter(Exporter):
    """Exports after every evaluation and keeps the newest `exports_to_keep`.

    Args:
      name: The export directory's name (`model_dir/export/<name>`).
      serving_input_receiver_fn: Returns a `ServingInputReceiver`.
      assets_extra: dict destination -> source path for `assets.extra`.
      as_text: Write the SavedModel proto as text.
      exports_to_keep: How many exports to keep (int >= 1), None: all.

    Raises:
      ValueError: `exports_to_keep` is not positive.
    """

    def __init__(
        self, name, serving_input_receiver_fn, assets_extra=None, as_text=False, exports_to_keep=5
    ):
        self._exporter = _SavedModelExporter(name, serving_input_receiver_fn, assets_extra, as_text)
        self._exports_to_keep = _check_keep(exports_to_keep)

    @property
    def name(self) -> str:
        return self._exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        path = self._exporter.export(
            estimator, export_path, checkpoint_path, eval_result, is_the_final_export
        )
        _keep_newest(export_path, self._exports_to_keep)
        return path


class FinalExporter(Exporter):
    """Exports once, after the evaluation of training's last checkpoint.

    Args:
      name: The export directory's name (`model_dir/export/<name>`).
      serving_input_receiver_fn: Returns a `ServingInputReceiver`.
      assets_extra: dict destination -> source path for `assets.extra`.
      as_text: Write the SavedModel proto as text.
    """

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        self._exporter = _SavedModelExporter(name, serving_input_receiver_fn, assets_extra, as_text)

    @property
    def name(self) -> str:
        return self._exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if not is_the_final_export:
            return None
        logging.info("Performing the final export in the end of training.")
        return self._exporter.export(
            estimator, export_path, checkpoint_path, eval_result, is_the_final_export
        )


def loss_smaller(best_eval_result, current_eval_result) -> bool:
    """BestExporter's default `compare_fn`: True when the current `loss` is smaller.

    Raises:
      ValueError: either result is empty or has no `loss`.
    """
    for label, result in (
        ("best_eval_result", best_eval_result),
        ("current_eval_result", current_eval_result),
    ):
        if not result or "loss" not in result:
            raise ValueError(f"`{label}` must hold a 'loss'. Received: {label}={result!r}")
    return best_eval_result["loss"] > current_eval_result["loss"]


def _check_compare_fn(compare_fn):
    if compare_fn is None or not callable(compare_fn):
        raise ValueError(f"`compare_fn` must be callable. Received: compare_fn={compare_fn!r}")
    names = set(inspect.signature(compare_fn).parameters)
    if names != {"best_eval_result", "current_eval_result"}:
        raise ValueError(
            "`compare_fn` must take exactly the arguments `best_eval_result` and "
            f"`current_eval_result`. Received a function of {sorted(names)}"
        )


def _eval_results(pattern: str):
    """Every evaluation result (tag -> simple value) in the event files matching `pattern`."""
    for path in sorted(glob.glob(pattern)):
        for event in tf.compat.v1.train.summary_iterator(path):
            if not event.HasField("summary"):
                continue
            result = {
                v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")
            }
            if result:
                yield result


class BestExporter(Exporter):
    """Exports when an evaluation is better than every earlier one (by `compare_fn`).

    Args:
      name: The export directory's name (`model_dir/export/<name>`).
      serving_input_receiver_fn: Returns a `ServingInputReceiver`.
      event_file_pattern: Evaluation event files, relative to `model_dir`,
        the best result so far is read from (so a restarted run remembers
        it); None: only this process's evaluations count.
      compare_fn: `compare_fn(best_eval_result, current_eval_result)` ->
        True when the current result is better; default: smaller `loss`.
      assets_extra: dict destination -> source path for `assets.extra`.
      as_text: Write the SavedModel proto as text.
      exports_to_keep: How many exports to keep (int >= 1), None: all.

    Raises:
      ValueError: `compare_fn` is None or takes other arguments, or
        `exports_to_keep` is not positive.
    """

    def __init__(
        self,
        name="best_exporter",
        serving_input_receiver_fn=None,
        event_file_pattern="eval/*.tfevents.*",
        compare_fn=loss_smaller,
        assets_extra=None,
        as_text=False,
        exports_to_keep=5,
    ):
        _check_compare_fn(compare_fn)
        self._compare_fn = compare_fn
        self._exporter = _SavedModelExporter(name, serving_input_receiver_fn, assets_extra, as_text)
        self._event_file_pattern = event_file_pattern
        self._exports_to_keep = _check_keep(exports_to_keep)
        self._model_dir = None
        self._best_eval_result = None
        self._has_exported = False

    @property
    def name(self) -> str:
        return self._exporter.name

    def _best_in_event_files(self, pattern: str):
        best = None
        for result in _eval_results(pattern):
            if best is None or self._compare_fn(best_eval_result=best, current_eval_result=result):
                best = result
        return best

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if self._model_dir != estimator.model_dir and self._event_file_pattern:
            self._model_dir = estimator.model_dir
            self._best_eval_result = self._best_in_event_files(
                os.path.join(self._model_dir, self._event_file_pattern)
            )
        if (
            self._best_eval_result is not None
            and self._has_exported
            and not self._compare_fn(
                best_eval_result=self._best_eval_result, current_eval_result=eval_result
            )
        ):
            return None
        logging.info("Performing best model export.")
        self._best_eval_result = eval_result
        path = self._exporter.export(
            estimator, export_path, checkpoint_path, eval_result, is_the_final_export
        )
        _keep_newest(export_path, self._exports_to_keep)
        self._has_exported = True
        return path


def check_exporters(exporters) -> tuple:
    """`EvalSpec.exporters` as a tuple: one `Exporter`, an iterable of them, or None.

    Raises:
      TypeError: something that is not an `Exporter`.
      ValueError: an exporter without a string name, or two of the same name.
    """
    if not exporters:
        return ()
    if isinstance(exporters, Exporter):
        exporters = [exporters]
    try:
        exporters = tuple(exporters)
    except TypeError:
        raise TypeError(
            "`exporters` must be an Exporter, an iterable of Exporters, or None. "
            f"Received: {exporters!r}"
        ) from None
    names = []
    for exporter in exporters:
        if not isinstance(exporter, Exporter):
            raise TypeError(
                "`exporters` must be an Exporter, an iterable of Exporters, or None. "
                f"Received: {exporter!r}"
            )
        if not exporter.name or not isinstance(exporter.name, str):
            raise ValueError(
                f"An Exporter needs a non-empty string name. Received: name={exporter.name!r}"
            )
        if exporter.name in names:
            raise ValueError(
                f"`exporters` must have unique names. Received: {[e.name for e in exporters]}"
            )
        names.append(exporter.name)
    return exporters
