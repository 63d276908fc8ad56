r"""Trains a reference model (DeepFM, Wide&Deep, DLRM) on npu_rec sparse tables.

Examples:
  python3 run.py script train                                    # Keras DeepFM, synthetic data
  python3 run.py script train --frontend=estimator --model=dlrm --embedding_dim=16
  python3 run.py script train --data=criteo_sample --max_steps=200 --batch_size=32
  python3 run.py script train --data='/data/day_*.parquet' --categorical_features=C1,C2 \
      --dense_features=I1,I2 --model_dir=/tmp/run --incremental_checkpoint
  python3 run.py script train --model_dir=/tmp/run --restore_model_version=200
  python3 run.py script train --flagfile=my_run.flags --report=/tmp/run/report.png

A run resumes from the checkpoint in --model_dir (or --restore_model_version)
and stops at global step --max_steps. It prints a progress bar, then
`eval_loss=... eval_auc=... samples_per_sec=...` and the table sizes, and
writes metrics.json and TensorBoard events (`events/`) to --model_dir.
"""

from __future__ import annotations

import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from npu_rec.scripts import _cli, _run_record, _workers
from npu_rec.scripts import _flags as F

# TensorFlow loads with these, once the flags are parsed and checked (`--help` is immediate).
_checkpoints = _cli.lazy("npu_rec.scripts._checkpoints")
_data = _cli.lazy("npu_rec.scripts._data")
_frontends = _cli.lazy("npu_rec.scripts._frontends")
_report = _cli.lazy("npu_rec.scripts._report")

flags.adopt_module_key_flags(F)


def settings_from_flags(model_dir: str | None = None) -> _frontends.RunSettings:
    """The `RunSettings` of the parsed flags (a temporary --model_dir when unset)."""
    model_dir = model_dir or F.MODEL_DIR.value or tempfile.mkdtemp(prefix="npu_rec_run_")
    return _frontends.RunSettings(
        model=F.MODEL.value,
        frontend=F.FRONTEND.value,
        batch_size=F.BATCH_SIZE.value,
        max_steps=F.MAX_STEPS.value,
        eval_steps=F.EVAL_STEPS.value,
        save_steps=F.SAVE_STEPS.value,
        model_dir=model_dir,
        embedding_dim=F.EMBEDDING_DIM.value,
        access_threshold=F.ACCESS_THRESHOLD.value,
        not_admitted=F.NOT_ADMITTED.value,
        fallback_buckets=F.FALLBACK_BUCKETS.value,
        eviction_threshold=F.EVICTION_THRESHOLD.value,
        evict_steps=F.EVICT_STEPS.value,
        memory_rows=F.MEMORY_ROWS.value,
        ssd_path=tuple(F.SSD_PATH.value or ()),
        table_per_feature=F.TABLE_PER_FEATURE.value,
        incremental_checkpoint=F.INCREMENTAL.value,
        save_checkpoint_due_time=F.FULL_SECS.value,
        save_delta_checkpoints_secs=F.DELTA_SECS.value,
        accelerate_train_mode=F.ACCELERATE.value,
        precision_mode=F.PRECISION.value,
        restore_model_version=F.RESTORE_VERSION.value,
        seed=F.SEED.value,
        keep_checkpoint_max=F.KEEP.value,
        learning_rate=F.LEARNING_RATE.value,
        sparse_learning_rate=F.SPARSE_LEARNING_RATE.value,
        sparse_optimizer=F.SPARSE_OPTIMIZER.value,
        value_dtype=F.VALUE_DTYPE.value,
        verbose=F.VERBOSE.value,
    )


def data_plan_from_flags() -> _data.DataPlan:
    """The `DataPlan` of --data, --format, --eval_data and the column flags."""
    return _data.plan(
        F.DATA.value,
        fmt=F.FORMAT.value,
        eval_data=F.EVAL_DATA.value,
        label=F.LABEL.value,
        dense=F.DENSE_FEATURES.value,
        categorical=F.CATEGORICAL_FEATURES.value,
        seed=F.SEED.value,
        kafka=F.KAFKA.value,
        topic=F.TOPIC.value,
    )


def settings_and_plan(adjust=None, *, record_run: bool = False):
    """(`RunSettings`, `DataPlan`) of the flags, with the model flags of --model_dir's run.

    Flags left at their defaults take the values recorded by the run that made
    --model_dir (`scripts/_run_record.py`); a conflicting explicit value fails. A
    --model_dir without a checkpoint has no model yet: its record is replaced.

    Args:
      adjust: optional callable changing the settings in place (online_train.py).
      record_run: write the record when --model_dir holds no run yet (training).

    Raises:
      app.UsageError: a flag, or the data's columns, conflict with the recorded run;
        --restore_model_version names no committed version of --model_dir.
    """
    model_dir = _workers.model_dir(F.MODEL_DIR.value or tempfile.mkdtemp(prefix="npu_rec_run_"))
    versions = _checkpoints.restorable_versions(model_dir)
    wanted = F.RESTORE_VERSION.value
    if wanted is not None and wanted not in versions:
        raise app.UsageError(
            f"--restore_model_version={wanted} names no committed version in "
            f"--model_dir={model_dir!r}. Existing versions: {sorted(set(versions))}"
        )
    trained = bool(versions)
    record = _run_record.apply(model_dir) if trained else None  # else a run that saved nothing
    settings = settings_from_flags(model_dir)
    if adjust is not None:
        adjust(settings)
    plan = data_plan_from_flags()
    _run_record.check_columns(model_dir, record, plan)
    if record_run and not trained:
        _run_record.write(model_dir, settings, plan)
    return settings, plan


def finish(settings, plan, metrics: dict, log) -> dict:
    """Writes events, metrics.json and the report; prints the summary."""
    log.write_events(os.path.join(settings.model_dir, "events"))
    _report.write_metrics(settings.model_dir, metrics)
    if F.REPORT.value:
        title = f"{settings.model} / {settings.frontend} on {plan.name}"
        metrics["report"] = _report.write_report(F.REPORT.value, log, title)
    _report.print_summary(metrics)
    return metrics


def already_complete(settings) -> dict | None:
    """The last run's metrics when --model_dir has reached --max_steps (nothing to train).

    Only a committed version that exists (the one --restore_model_version names,
    else the newest) counts. Prints that training was already complete and the
    summary of metrics.json, which is kept as the last real run wrote it. None
    when there is training to do.
    """
    versions = _checkpoints.restorable_versions(settings.model_dir)
    step = settings.restore_model_version
    if step is None:
        step = versions[-1] if versions else None
    if step is None or step not in versions or step < settings.max_steps:
        return None
    path = os.path.join(settings.model_dir, "metrics.json")
    print(
        f"npu_rec: training was already complete: global step {step} >= "
        f"--max_steps={settings.max_steps} in --model_dir={settings.model_dir} (raise "
        f"--max_steps to train further). The last run's metrics, kept in {path}:",
        flush=True,
    )
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            metrics = json.load(f)
    except (OSError, ValueError) as err:
        print(f"npu_rec: warning: {path} is unreadable ({err}); no metrics to show.", flush=True)
        return {}
    _report.print_summary(metrics)
    return metrics


def run() -> dict:
    """Trains and evaluates as the flags say; returns the metrics (also printed)."""
    settings, plan = settings_and_plan(record_run=_workers.writes_files())
    _workers.check_frontend(settings.frontend)
    done = already_complete(settings)
    if done is not None:
        return done
    if settings.verbose:
        print(
            f"npu_rec: training {settings.model} ({settings.frontend}) on {plan.name}, "
            f"model_dir={settings.model_dir}",
            flush=True,
        )
    metrics, log, _ = _frontends.run(settings, plan)
    if metrics is None:  # a ps, worker or evaluator task of the ps route: the chief reports
        return {}
    return finish(settings, plan, metrics, log)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    _workers.setup()  # several workers in TF_CONFIG: before any TensorFlow op
    F.check_now()
    _cli.quiet_logs()
    run()


if __name__ == "__main__":
    _cli.run(main, __doc__)
