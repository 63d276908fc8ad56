"""One training run of a reference model, on either front end, from a `RunSettings`.

`train.py`, `online_train.py` and `evaluate.py` call these functions; the
absl flags are read only by the scripts themselves, so tests and notebooks
can call `run_keras` / `run_estimator` directly.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque

import keras
import numpy as np
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from npu_rec.keras import callbacks as kcb
from npu_rec.models import TRAIN_OUTPUTS, build_rec_model, estimator_model_fn, specs_for
from npu_rec.scripts import _checkpoints, _data, _report, _workers
from npu_rec.table import _registry as _table_registry
from npu_rec.table._create import tier_defaults


@dataclasses.dataclass
class RunSettings:
    """What a run trains, on what, how long, and where it writes (the scripts' flags)."""

    model: str = "deepfm"
    frontend: str = "keras"
    batch_size: int = 1024
    max_steps: int = 300
    eval_steps: int = 40
    save_steps: int = 1000
    model_dir: str = ""
    embedding_dim: int = 8
    access_threshold: int = -1
    not_admitted: str = "zeros"
    fallback_buckets: int = 1 << 20
    eviction_threshold: int = -1
    evict_steps: int = 100
    memory_rows: int | None = None
    ssd_path: tuple = ()
    table_per_feature: bool = False
    incremental_checkpoint: bool = False
    save_checkpoint_due_time: int = 60
    save_delta_checkpoints_secs: int = 10
    accelerate_train_mode: str | None = None
    precision_mode: str | None = None
    restore_model_version: int | None = None
    keep_checkpoint_max: int = 0
    seed: int = 0
    learning_rate: float = 1e-3
    sparse_learning_rate: float = 0.05
    sparse_optimizer: str = "adagrad"
    value_dtype: str = "float32"
    verbose: int = 1


def init_npu_rec(s: RunSettings) -> None:
    """`npu_rec.init` from the settings, so its step-consistency rules check the run."""
    npu_rec.shutdown()
    inc = s.incremental_checkpoint
    npu_rec.init(
        max_steps=s.max_steps,
        save_steps=s.save_steps,
        if_load=True,
        restore_model_version=s.restore_model_version,
        use_dynamic_expansion=True,
        bind_cpu=False,
        is_incremental_checkpoint=inc,
        save_checkpoint_due_time=s.save_checkpoint_due_time if inc else None,
        save_delta_checkpoints_secs=s.save_delta_checkpoints_secs if inc else None,
    )


def _specs(s: RunSettings, plan: _data.DataPlan):
    admission = None if s.access_threshold < 0 else s.access_threshold
    eviction = None if s.eviction_threshold < 0 else s.eviction_threshold
    return specs_for(
        plan.categorical,
        table_name=None if s.table_per_feature else "categorical",
        access_threshold=admission,
        eviction_threshold=eviction,
    )


def _model_kwargs(s: RunSettings, plan: _data.DataPlan) -> dict:
    lr = s.sparse_learning_rate
    make = _SPARSE_OPTIMIZERS[s.sparse_optimizer]
    kwargs = dict(
        embedding_dim=s.embedding_dim,
        seed=s.seed,
        sparse_optimizer=lambda: make(lr),
        value_dtype=s.value_dtype,
    )
    if s.not_admitted != "zeros":  # ids below the admission threshold: a trained fallback
        kwargs["table_options"] = {
            "not_admitted": s.not_admitted,
            "fallback_buckets": s.fallback_buckets,
        }
    return kwargs


#: --sparse_optimizer -> the table optimizer's class.
_SPARSE_OPTIMIZERS = {
    "adagrad": npu_rec.optimizers.Adagrad,
    "rowwise_adagrad": npu_rec.optimizers.RowWiseAdagrad,
    "sgd": npu_rec.optimizers.SGD,
    "adam": npu_rec.optimizers.Adam,
    "ftrl": npu_rec.optimizers.Ftrl,
}


def _result(s, plan, log, eval_results, sizes, step, seconds) -> dict:
    return {
        "frontend": s.frontend,
        "model": s.model,
        "data": plan.name,
        "batch_size": s.batch_size,
        "global_step": int(step),
        "steps": len(log.steps),
        "start_step": int(log.start if not log.steps else log.steps[0] - 1),
        "eval_loss": float(eval_results["loss"]),
        "eval_auc": float(eval_results["auc"]),
        "train_seconds": round(seconds, 2),
        "samples_per_sec": round(log.samples_per_sec, 1),
        "peak_memory_mb": _report.peak_memory_mb(),
        "table_sizes": sizes,
        "model_dir": s.model_dir,
    }


def _close_stream(source) -> None:
    """Closes a stream source after training: its last committed offsets reach the broker.

    File sources stay as they are (nothing to tell anyone; the process ends soon).
    """
    if isinstance(source, npu_rec.data.KafkaSource):
        source.close()


# --------------------------------------------------------------------- Keras
def keras_model(s: RunSettings, plan: _data.DataPlan):
    """The compiled `RecModel` of the run."""
    keras.utils.set_random_seed(s.seed)
    model = build_rec_model(s.model, _specs(s, plan), plan.dense, **_model_kwargs(s, plan))
    model.compile(
        optimizer=keras.optimizers.Adam(s.learning_rate),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    return model


def run_keras(s: RunSettings, plan: _data.DataPlan, *, train: bool = True):
    """Trains (resuming from `s.model_dir`) with `RecModel.online_train`, then evaluates.

    `online_train` stops at `npu_rec.init(max_steps)`, counting a resumed
    run's restored steps; `SparseCheckpoint` saves full (and, with
    `incremental_checkpoint`, delta) versions with the data position.

    Returns:
      (metrics dict, `MetricLog`, model).
    """
    with _workers.scope():  # several workers: tables sharded, dense part mirrored
        model = keras_model(s, plan)
    ds, source, position = _data.train_dataset(plan, s.batch_size)
    ds = _workers.distribute(ds)
    ckpt = kcb.SparseCheckpoint(
        s.model_dir,
        save_freq=s.save_steps,
        data_source=source,
        reading_position=position,
        keep_checkpoint_max=s.keep_checkpoint_max,
    )
    log = _report.MetricLog(s.batch_size, s.max_steps, 0, s.verbose if train else 0)
    callbacks = [ckpt, _report.KerasProgress(log)]
    if s.eviction_threshold >= 0:
        callbacks.append(kcb.Evict(evict_time_interval=None, evict_step_interval=s.evict_steps))
    if s.accelerate_train_mode:
        callbacks.append(kcb.AccelerateTrain(s.accelerate_train_mode, total_step=s.max_steps))
    start = time.perf_counter()
    try:  # an error prints on a line of its own, after the closed progress bar
        if train:
            model.online_train(ds, callbacks=callbacks, dataset_sink_mode=False)
        else:
            ckpt.prepare(model)
    finally:
        log.close()
        _close_stream(source)
    log.start = ckpt.restored_step or 0
    seconds = time.perf_counter() - start
    results = model.evaluate(
        _data.eval_dataset(plan, s.batch_size, s.eval_steps), return_dict=True, verbose=0
    )
    sizes = {t.name: int(t.size()) for t in model.tables}
    metrics = _result(s, plan, log, results, sizes, model.global_step, seconds)
    metrics["table_memory"] = {t.name: t.memory_stats() for t in model.tables}
    tiers = {t.name: t.tier_stats() for t in model.tables if t.config.memory_rows is not None}
    if tiers:  # hit rate, promotions, bytes read and written of tiered tables
        metrics["tier"] = tiers
    return metrics, log, model


# ----------------------------------------------------------------- Estimator
class _ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Feeds a `MetricLog`: loss per step and the AUC of the last 20 batches."""

    def __init__(self, log: _report.MetricLog, window: int = 20):
        self.log = log
        self._labels = deque(maxlen=window)
        self._probs = deque(maxlen=window)

    def begin(self):
        outputs = tf.compat.v1.get_collection(TRAIN_OUTPUTS)
        self._fetches = {"step": tf.compat.v1.train.get_global_step()}
        if len(outputs) == 3:
            self._fetches.update(loss=outputs[0], labels=outputs[1], probs=outputs[2])

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        r = run_values.results
        auc = None
        if "labels" in r:
            self._labels.append(r["labels"])
            self._probs.append(r["probs"])
            auc = _report.window_auc(np.concatenate(self._labels), np.concatenate(self._probs))
        # The global step fetched with the train op is its value before this step.
        self.log.record(r["step"] + 1, r.get("loss", float("nan")), auc)


class _TierStatsHook(tf.compat.v1.train.SessionRunHook):
    """The `tier_stats` of the training graph's tiered tables, read when training ends.

    The counters live in the tables' disk stores (Python); the rows kept in
    memory are variables, read through the session at `end`.
    """

    def __init__(self):
        self.stats: dict[str, dict] = {}

    def begin(self):
        self._tables = [t for t in _table_registry.tables() if t.config.memory_rows is not None]
        self._memory_keys = {
            t.name: tf.add_n([s.state.rows.live_count() for s in t.shards]) for t in self._tables
        }

    def end(self, session):
        if not self._tables:
            return
        memory = session.run(self._memory_keys)
        for t in self._tables:
            stats = t.tier_stats()
            stats["memory_keys"] = int(memory[t.name])
            self.stats[t.name] = stats


def estimator(s: RunSettings, plan: _data.DataPlan) -> E.NPUEstimator:
    """The `NPUEstimator` of the run (`keep_checkpoint_max` versions kept; 0 = all)."""
    experimental = (
        E.ExperimentalConfig(accelerate_train_mode=s.accelerate_train_mode)
        if s.accelerate_train_mode
        else None
    )
    config = E.NPURunConfig(
        model_dir=s.model_dir,
        save_checkpoints_steps=s.save_steps,
        save_summary_steps=min(100, s.save_steps),
        keep_checkpoint_max=s.keep_checkpoint_max,
        log_step_count_steps=100,
        precision_mode=s.precision_mode,
        experimental_config=experimental,
        random_seed=s.seed,
    )
    model_fn = estimator_model_fn(
        s.model,
        _specs(s, plan),
        plan.dense,
        learning_rate=s.learning_rate,
        **_model_kwargs(s, plan),
    )
    return E.NPUEstimator(model_fn, config=config)


def _start_step(s: RunSettings) -> int:
    if s.restore_model_version is not None:
        return s.restore_model_version
    latest = _checkpoints.latest_version(s.model_dir)
    return latest or 0


def run_estimator(s: RunSettings, plan: _data.DataPlan, *, train: bool = True):
    """Trains (resuming from `s.model_dir`) with `NPUEstimator.train`, then evaluates.

    On the ps route (`TF_CONFIG` with ps tasks, `_workers.role()`): a ps task
    serves until training ends, a worker trains, the evaluator evaluates each
    new checkpoint until the one at `max_steps` (`train_and_evaluate`); they
    return None metrics. The chief trains and evaluates as one process does.

    Returns:
      (metrics dict or None, `MetricLog`, estimator).
    """
    est = estimator(s, plan)
    start_step = _start_step(s)
    role = _workers.role()
    if role in ("ps", "worker", "evaluator"):
        return _run_estimator_task(s, plan, est, role), None, est
    log = _report.MetricLog(s.batch_size, s.max_steps, start_step, s.verbose if train else 0)
    tier = _TierStatsHook()
    hooks = [_ProgressHook(log), tier]
    if s.eviction_threshold >= 0:
        hooks.append(
            E.EvictHook(
                evict_enable=True, evict_time_interval=None, evict_step_interval=s.evict_steps
            )
        )
    start = time.perf_counter()
    try:  # an error prints on a line of its own, after the closed progress bar
        if train and start_step < s.max_steps:
            input_fn = _data.train_input_fn(plan, s.batch_size)
            try:
                est.train(input_fn, max_steps=s.max_steps, hooks=hooks)
            finally:
                _close_stream(input_fn.source)
    finally:
        log.close()
    seconds = time.perf_counter() - start
    results = est.evaluate(
        lambda: _data.eval_dataset(plan, s.batch_size, s.eval_steps), steps=s.eval_steps
    )
    sizes = _checkpoints.table_sizes(s.model_dir)
    metrics = _result(s, plan, log, results, sizes, results["global_step"], seconds)
    # The tables live in the estimator's graphs: their memory as restored from the checkpoint.
    metrics["table_memory"] = _checkpoints.table_memory(s.model_dir)
    if tier.stats:  # tiered tables, as the training graph left them
        metrics["tier"] = tier.stats
    if role == "chief" and seconds > 0:  # the cluster's rate: every trainer's batches
        done = results["global_step"] - start_step
        metrics["samples_per_sec"] = round(done * s.batch_size / seconds, 1)
    return metrics, log, est


def _run_estimator_task(s: RunSettings, plan: _data.DataPlan, est, role: str) -> None:
    """A ps, worker or evaluator task of the ps route (prints what it did)."""
    train_spec = E.TrainSpec(_data.train_input_fn(plan, s.batch_size), max_steps=s.max_steps)
    eval_spec = E.EvalSpec(
        lambda: _data.eval_dataset(plan, s.batch_size, s.eval_steps), steps=s.eval_steps
    )
    result, _ = E.train_and_evaluate(est, train_spec, eval_spec)
    if role == "evaluator" and result is not None:
        print(
            f"npu_rec: evaluator: global_step={result['global_step']} "
            f"eval_loss={result['loss']:.4f} eval_auc={result['auc']:.4f}",
            flush=True,
        )
    else:
        print(f"npu_rec: {role} task finished (training reached --max_steps).", flush=True)


def run(s: RunSettings, plan: _data.DataPlan, *, train: bool = True):
    """`run_keras` or `run_estimator`, after `init_npu_rec`."""
    init_npu_rec(s)
    os.makedirs(s.model_dir, exist_ok=True)
    fn = run_keras if s.frontend == "keras" else run_estimator
    if s.memory_rows is None:
        return fn(s, plan, train=train)
    with tier_defaults(s.memory_rows, list(s.ssd_path)):  # every table of the run is tiered
        return fn(s, plan, train=train)
