"""`RunConfig`, `NPURunConfig` and `ExperimentalConfig`: validated, read-only run settings.

`NPURunConfig` keeps npu_bridge's signature. The options that mean something
on CPU/GPU are validated eagerly (one `_validate()` per class, read like the
table in docs/estimator.md); the NPU-only ones (graph engine, dump, HCCL, ...)
are accepted and warned about once; unknown keywords are warned about once,
by name. `precision_mode` / `precision_mode_v2` map to a Grappler rewrite of
the session config (see `PRECISION_MODES`).
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from npu_rec._rec_config import check_int
from npu_rec._validation import check_number, warn_once
from npu_rec.estimator._ps import ClusterInfo
from npu_rec.training._precision import check_precision_compatibility, parse_accelerate_train_mode

_UNSET: Any = object()
#: Steps between checkpoints when neither steps nor seconds are given.
DEFAULT_SAVE_CHECKPOINTS_STEPS = 100

# Precision setting -> what TensorFlow does: None (float32 / origin dtypes),
# "float16" (Grappler auto_mixed_precision; its CPU emulation without a GPU) or
# "bfloat16" (Grappler oneDNN bfloat16 AMP, CPU).
PRECISION_MODES = {
    "force_fp32": None,
    "must_keep_origin_dtype": None,
    "allow_fp32_to_fp16": None,
    "allow_fp32_to_bf16": None,
    "force_fp16": "float16",
    "allow_mix_precision": "float16",
    "allow_mix_precision_fp16": "float16",
    "cube_fp16in_fp32out": "float16",
    "allow_mix_precision_bf16": "bfloat16",
}
PRECISION_MODES_V2 = {
    "origin": None,
    "fp16": "float16",
    "cube_fp16in_fp32out": "float16",
    "mixed_float16": "float16",
    "mixed_bfloat16": "bfloat16",
}
_UNSUPPORTED_V2 = ("cube_hif8", "mixed_hif8")

# npu_bridge NPURunConfig options that only configure the Ascend stack.
NPU_ONLY_OPTIONS = frozenset(
    {
        "enable_data_pre_proc",
        "mix_compile_mode",
        "graph_run_mode",
        "dump_config",
        "profiling_config",
        "enable_reduce_precision",
        "variable_format_optimize",
        "hcom_parallel",
        "graph_memory_max_size",
        "variable_memory_max_size",
        "auto_tune_mode",
        "stream_max_parallel_num",
        "is_tailing_optimization",
        "horovod_mode",
        "enable_exception_dump",
        "op_select_implmode",
        "optypelist_for_implmode",
        "dynamic_input_config",
        "aoe_mode",
        "work_path",
        "buffer_optimize",
        "enable_small_channel",
        "fusion_switch_file",
        "enable_compress_weight",
        "compress_weight_conf",
        "op_compiler_cache_mode",
        "op_compiler_cache_dir",
        "debug_dir",
        "hcom_multi_mode",
        "dynamic_input",
        "dynamic_graph_execute_mode",
        "dynamic_inputs_shape_range",
        "local_rank_id",
        "local_device_list",
        "session_device_id",
        "distribute_config",
        "modify_mixlist",
        "op_precision_mode",
        "device_type",
        "soc_config",
        "hccl_timeout",
        "op_wait_timeout",
        "op_execute_timeout",
        "HCCL_algorithm",
        "customize_dtypes",
        "op_debug_config",
        "memory_config",
        "topo_sorting_mode",
        "aoe_config_file",
        "insert_op_file",
        "stream_sync_timeout",
        "event_sync_timeout",
        "external_weight",
        "es_cluster_config",
        "deterministic",
        "frozen_variable",
        "variable_placement",
        "jit_compile",
        "ac_parallel_enable",
        "quant_dumpable",
        "input_fusion_size",
        "compile_dynamic_mode",
        "graph_max_parallel_model_num",
        "export_compile_stat",
        "aicore_num",
        "oo_constant_folding",
        "input_batch_cpy",
        "shape_generalization_mode",
        "all_tensor_not_empty",
        "auto_multistream_parallel_mode",
        "compile_hybrid_mode",
        "oo_level",
        "optimization_switch",
        "train_distribute",
        "eval_distribute",
        "enable_scope_fusion_passes",
        "op_debug_level",
        "precision_mode_v1",
        "graph_exec_timeout",
        "logical_device_cluster_deploy_mode",
        "logical_device_id",
        "model_deploy_mode",
        "model_deploy_devicelist",
        "resource_config_path",
        "graph_parallel_option_path",
        "enable_graph_parallel",
        "graph_compiler_cache_dir",
        "atomic_clean_policy",
    }
)
# Options of tf.estimator.RunConfig npu_rec accepts through **more.
_RUNCONFIG_EXTRAS = ("tf_random_seed", "keep_checkpoint_every_n_hours")


def _sort_extras(owner: str, more: dict) -> None:
    """Warns once about NPU-only options and, separately, unknown ones."""
    npu = sorted(k for k in more if k in NPU_ONLY_OPTIONS)
    unknown = sorted(k for k in more if k not in NPU_ONLY_OPTIONS)
    if npu:
        warn_once(
            f"{owner}: options {npu} configure the Ascend NPU only and have no "
            "effect on this platform.",
            stacklevel=3,
        )
    if unknown:
        warn_once(f"{owner}: unknown options {unknown} are ignored.", stacklevel=3)


def _check_number(name: str, value, *, lower: float, optional: bool = True):
    """Checks `value` is a number >= `lower` (or None if optional); returns it unchanged."""
    check_number(name, value, lower, optional=optional, rule=f"None or a number >= {lower}")
    return value


def precision_dtype(precision_mode=None, precision_mode_v2=None) -> str | None:
    """The low precision TensorFlow uses for a precision setting (None = float32).

    Raises:
      ValueError: both are set, or a value is unknown or unsupported here.
    """
    if precision_mode is not None and precision_mode_v2 is not None:
        raise ValueError(
            "Set only one of `precision_mode` and `precision_mode_v2`. Received: "
            f"precision_mode={precision_mode!r}, precision_mode_v2={precision_mode_v2!r}"
        )
    if precision_mode is not None:
        if precision_mode not in PRECISION_MODES:
            raise ValueError(
                f"`precision_mode` must be one of {sorted(PRECISION_MODES)}. "
                f"Received: precision_mode={precision_mode!r}"
            )
        return PRECISION_MODES[precision_mode]
    if precision_mode_v2 is not None:
        if precision_mode_v2 in _UNSUPPORTED_V2:
            raise ValueError(
                f"`precision_mode_v2`={precision_mode_v2!r} (HiFloat8) is not supported on "
                f"this platform; use one of {sorted(PRECISION_MODES_V2)}. "
                f"Received: precision_mode_v2={precision_mode_v2!r}"
            )
        if precision_mode_v2 not in PRECISION_MODES_V2:
            raise ValueError(
                f"`precision_mode_v2` must be one of {sorted(PRECISION_MODES_V2)}. "
                f"Received: precision_mode_v2={precision_mode_v2!r}"
            )
        return PRECISION_MODES_V2[precision_mode_v2]
    return None


def float16_available() -> bool:
    """Whether a GPU runs float16 natively (else the CPU emulation of the AMP pass is used)."""
    return bool(tf.config.list_physical_devices("GPU"))


# Grappler passes that run before the AMP pass and may leave the graph out of
# topological order; the CPU float16 emulation needs them off (see below).
_PRE_AMP_PASSES = (
    "function_optimization",
    "common_subgraph_elimination",
    "debug_stripper",
    "constant_folding",
    "shape_optimization",
    "implementation_selector",
)


def session_config_for(base, dtype: str | None):
    """A copy of `base` (a ConfigProto or None) with the AMP rewrite for `dtype` on.

    - bfloat16: Grappler's oneDNN bfloat16 AMP (`auto_mixed_precision_onednn_bfloat16`).
    - float16 on a GPU: Grappler's `auto_mixed_precision`.
    - float16 without a GPU: `auto_mixed_precision_cpu`, the CPU mode of the same
      pass. Every op of its float16 allow list gets its float inputs and outputs
      rounded to float16 (a Cast to float16 and back): the numerics of float16
      training, computed by float32 kernels. That pass aborts (a C++
      `raw_hash_map::at` error, which kills the process inside `Session.run`)
      when the graph it receives is not in topological order, which the
      Grappler passes running before it (model pruning, function inlining,
      common subgraph elimination, constant folding, ...) may cause; they are
      turned off in this mode, so the pass sees the graph in the order Python
      built it. The passes after it (arithmetic, remapper, ...) still run.
    """
    config = tf.compat.v1.ConfigProto()
    if base is not None:
        config.CopyFrom(base)
    rw = config.graph_options.rewrite_options
    on = rewriter_config_pb2.RewriterConfig.ON
    if dtype == "bfloat16":
        rw.auto_mixed_precision_onednn_bfloat16 = on
    elif dtype == "float16" and float16_available():
        rw.auto_mixed_precision = on
    elif dtype == "float16":
        rw.auto_mixed_precision_cpu = on
        rw.disable_model_pruning = True
        for name in _PRE_AMP_PASSES:
            setattr(rw, name, rewriter_config_pb2.RewriterConfig.OFF)
    return config


class _Frozen:
    """Read-only attributes after `__init__`, and `replace(**kwargs)`."""

    _FIELDS: tuple[str, ...] = ()
    _frozen = False

    def __setattr__(self, name, value):
        if self._frozen:
            raise AttributeError(
                f"{type(self).__name__} is read-only; use "
                f".replace({name}=...) to get a changed copy."
            )
        object.__setattr__(self, name, value)

    def _kwargs(self) -> dict:
        return {f: getattr(self, f) for f in self._FIELDS}

    def replace(self, **kwargs):
        """A copy with `kwargs` changed, validated again.

        Raises:
          ValueError: an unknown key, or a new value that breaks a rule.
        """
        unknown = sorted(set(kwargs) - set(self._FIELDS))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.replace() got unknown options {unknown}; "
                f"known: {list(self._FIELDS)}"
            )
        return type(self)(**{**self._kwargs(), **kwargs})

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self._kwargs().items())
        return f"{type(self).__name__}({body})"


class ExperimentalConfig(_Frozen):
    """npu_bridge's `ExperimentalConfig`: only `accelerate_train_mode` has an effect.

    Args:
      accelerate_train_mode: "type|trigger[|ratio]", e.g. "fast|step|0.9" or
        "fast1|loss|1.05" (see docs/estimator.md); None = off.
      **more: other npu_bridge options (warned once: no effect here).

    Raises:
      TypeError / ValueError: `accelerate_train_mode` is malformed (the message
        names the field and the value).

    Example:
      >>> cfg = ExperimentalConfig(accelerate_train_mode="fast1|step|0.5")
      >>> cfg.accelerate_mode.dtype
      'bfloat16'
    """

    _FIELDS = ("accelerate_train_mode",)

    def __init__(self, accelerate_train_mode: str | None = None, **more):
        _sort_extras("ExperimentalConfig", more)
        self.accelerate_train_mode = accelerate_train_mode
        self._validate()
        self._frozen = True

    def _validate(self):
        mode = self.accelerate_train_mode
        self.accelerate_mode = None if mode is None else parse_accelerate_train_mode(mode)


class RunConfig(_Frozen):
    """tf.estimator's `RunConfig`: where and how often to checkpoint, summarise and log.

    Args:
      model_dir: Directory for checkpoints and event files (None: a temporary one).
      tf_random_seed: Graph-level random seed (int >= 0 or None).
      save_summary_steps: Steps between summaries (int >= 0; 0 = none).
      save_checkpoints_steps: Steps between checkpoints (int >= 1 or None).
      save_checkpoints_secs: Seconds between checkpoints (number > 0 or None).
        Neither given: every 100 steps. Both given: error.
      session_config: A `tf.compat.v1.ConfigProto` or None.
      keep_checkpoint_max: Versions kept in `model_dir` (int >= 0; 0 = all):
        every save there counts, across `train()` calls and processes; an old
        full save goes with the deltas that depend on it (dense and table
        files together), never what a kept version needs.
      keep_checkpoint_every_n_hours: Accepted for tf.estimator compatibility;
        no effect (retention counts versions).
      log_step_count_steps: Steps between "global_step/sec" logs (int >= 1 or None).
      checkpoint_fallback: When the newest version in `model_dir` is damaged,
        restore the newest older complete one with a WARNING (True), or raise
        `npu_rec.checkpoint.CheckpointCorruptedError` (False).

    The task and its cluster come from the `TF_CONFIG` environment variable
    when the config is made, as in tf.estimator: `cluster_spec`, `task_type`,
    `task_id`, `is_chief`, `master`, `evaluation_master`, `num_ps_replicas`,
    `num_worker_replicas`, `global_id_in_cluster` (table of values in
    `npu_rec/estimator/_ps/_cluster.py`; docs/distributed.md, "The Estimator route").

    Raises:
      ValueError: a value breaks its rule (the message names it), or
        `TF_CONFIG` is malformed.
    """

    _FIELDS = (
        "model_dir",
        "tf_random_seed",
        "save_summary_steps",
        "save_checkpoints_steps",
        "save_checkpoints_secs",
        "session_config",
        "keep_checkpoint_max",
        "keep_checkpoint_every_n_hours",
        "log_step_count_steps",
        "checkpoint_fallback",
    )

    def __init__(
        self,
        model_dir=None,
        tf_random_seed=None,
        save_summary_steps=100,
        save_checkpoints_steps=_UNSET,
        save_checkpoints_secs=_UNSET,
        session_config=None,
        keep_checkpoint_max=5,
        keep_checkpoint_every_n_hours=10000,
        log_step_count_steps=100,
        checkpoint_fallback=True,
        **more,
    ):
        _sort_extras(type(self).__name__, more)
        self.model_dir = model_dir
        self.tf_random_seed = tf_random_seed
        self.save_summary_steps = save_summary_steps
        self.save_checkpoints_steps = (
            None if save_checkpoints_steps is _UNSET else save_checkpoints_steps
        )
        self.save_checkpoints_secs = (
            None if save_checkpoints_secs is _UNSET else save_checkpoints_secs
        )
        self.session_config = session_config
        self.keep_checkpoint_max = keep_checkpoint_max
        self.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self.log_step_count_steps = log_step_count_steps
        self.checkpoint_fallback = checkpoint_fallback
        self._cluster = ClusterInfo.from_environment()
        self._validate()
        self._frozen = True

    def _validate(self):
        """The rules, one per option (docs/estimator.md, "Run configuration")."""
        if self.model_dir is not None:
            if not isinstance(self.model_dir, (str, os.PathLike)) or not str(self.model_dir):
                raise ValueError(
                    "`model_dir` must be None or a non-empty path. "
                    f"Received: model_dir={self.model_dir!r}"
                )
            self.model_dir = os.fspath(self.model_dir)
        self.tf_random_seed = check_int("tf_random_seed", self.tf_random_seed, 0, optional=True)
        self.save_summary_steps = check_int(
            "save_summary_steps", self.save_summary_steps, 0, optional=True
        )
        self.save_checkpoints_steps = check_int(
            "save_checkpoints_steps", self.save_checkpoints_steps, 1, optional=True
        )
        _check_number("save_checkpoints_secs", self.save_checkpoints_secs, lower=1e-9)
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise ValueError(
                "Set only one of `save_checkpoints_steps` and `save_checkpoints_secs`. "
                f"Received: save_checkpoints_steps={self.save_checkpoints_steps}, "
                f"save_checkpoints_secs={self.save_checkpoints_secs}"
            )
        if self.session_config is not None and not isinstance(
            self.session_config, tf.compat.v1.ConfigProto
        ):
            raise ValueError(
                "`session_config` must be None or a tf.compat.v1.ConfigProto. "
                f"Received: session_config={self.session_config!r}"
            )
        self.keep_checkpoint_max = check_int("keep_checkpoint_max", self.keep_checkpoint_max, 0)
        _check_number(
            "keep_checkpoint_every_n_hours",
            self.keep_checkpoint_every_n_hours,
            lower=1e-9,
            optional=False,
        )
        self.log_step_count_steps = check_int(
            "log_step_count_steps", self.log_step_count_steps, 1, optional=True
        )
        if not isinstance(self.checkpoint_fallback, bool):
            raise ValueError(
                "`checkpoint_fallback` must be True or False. "
                f"Received: checkpoint_fallback={self.checkpoint_fallback!r}"
            )

    def replace(self, **kwargs):
        """A copy with `kwargs` changed, validated again.

        As tf.estimator's `RunConfig.replace`: giving one of
        `save_checkpoints_steps` / `save_checkpoints_secs` (not None) and not
        the other switches the cadence, clearing the other.

        Raises:
          ValueError: an unknown key, both cadences given, or a new value that
            breaks a rule.
        """
        steps, secs = "save_checkpoints_steps", "save_checkpoints_secs"
        if kwargs.get(steps) is not None and secs not in kwargs:
            kwargs[secs] = None
        elif kwargs.get(secs) is not None and steps not in kwargs:
            kwargs[steps] = None
        return super().replace(**kwargs)

    @property
    def checkpoint_steps(self) -> int | None:
        """The step cadence in force: the explicit one, or 100 when no cadence is given."""
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            return DEFAULT_SAVE_CHECKPOINTS_STEPS
        return self.save_checkpoints_steps

    @property
    def random_seed(self):
        return self.tf_random_seed

    # The task and its cluster, read from TF_CONFIG when the config is made (`_ps.ClusterInfo`).
    @property
    def cluster(self) -> ClusterInfo:
        """All of the properties below in one object."""
        return self._cluster

    @property
    def cluster_spec(self) -> tf.train.ClusterSpec:
        return self._cluster.cluster_spec

    @property
    def task_type(self) -> str:
        return self._cluster.task_type

    @property
    def task_id(self) -> int:
        return self._cluster.task_id

    @property
    def is_chief(self) -> bool:
        return self._cluster.is_chief

    @property
    def master(self) -> str:
        return self._cluster.master

    @property
    def evaluation_master(self) -> str:
        return self._cluster.evaluation_master

    @property
    def num_ps_replicas(self) -> int:
        return self._cluster.num_ps_replicas

    @property
    def num_worker_replicas(self) -> int:
        return self._cluster.num_worker_replicas

    @property
    def global_id_in_cluster(self) -> int | None:
        return self._cluster.global_id_in_cluster


class NPURunConfig(RunConfig):
    """npu_bridge's `NPURunConfig` for npu_rec's Estimator.

    Args:
      model_dir, save_checkpoints_steps, save_checkpoints_secs, save_summary_steps,
      keep_checkpoint_max, log_step_count_steps, session_config: as `RunConfig`.
      iterations_per_loop: Training steps per `session.run` (int >= 1); hooks
        see one run per loop.
      precision_mode: npu_bridge precision mode (table in docs/estimator.md).
      precision_mode_v2: npu_bridge precision mode v2; not with `precision_mode`.
      experimental_config: An `ExperimentalConfig` or None.
      random_seed: Graph-level seed (alias `tf_random_seed`).
      **more: `tf_random_seed`, `keep_checkpoint_every_n_hours`,
        `checkpoint_fallback` (as `RunConfig`); NPU-only
        options (warned once: no effect here); unknown ones (warned once).

    Raises:
      ValueError: a value breaks its rule; both precision modes set; an
        accelerated mode with an incompatible precision mode.

    Example:
      >>> config = NPURunConfig(model_dir="/tmp/m", save_checkpoints_steps=100,
      ...                       precision_mode="allow_mix_precision_bf16")
      >>> config.compute_dtype
      'bfloat16'
    """

    _FIELDS = (
        "model_dir",
        "save_checkpoints_steps",
        "save_checkpoints_secs",
        "save_summary_steps",
        "keep_checkpoint_max",
        "log_step_count_steps",
        "iterations_per_loop",
        "precision_mode",
        "precision_mode_v2",
        "experimental_config",
        "session_config",
        "random_seed",
        "keep_checkpoint_every_n_hours",
        "checkpoint_fallback",
    )

    def __init__(
        self,
        model_dir=None,
        save_checkpoints_steps=None,
        save_checkpoints_secs=None,
        save_summary_steps=100,
        keep_checkpoint_max=5,
        log_step_count_steps=100,
        iterations_per_loop=1,
        precision_mode=None,
        precision_mode_v2=None,
        experimental_config=None,
        session_config=None,
        random_seed=None,
        **more,
    ):
        seed = more.pop("tf_random_seed", None)
        if seed is not None and random_seed is not None and seed != random_seed:
            raise ValueError(
                "`random_seed` and `tf_random_seed` name the same seed; they "
                f"differ. Received: random_seed={random_seed}, "
                f"tf_random_seed={seed}"
            )
        hours = more.pop("keep_checkpoint_every_n_hours", 10000)
        fallback = more.pop("checkpoint_fallback", True)
        object.__setattr__(self, "iterations_per_loop", iterations_per_loop)
        object.__setattr__(self, "precision_mode", precision_mode)
        object.__setattr__(self, "precision_mode_v2", precision_mode_v2)
        object.__setattr__(self, "experimental_config", experimental_config)
        super().__init__(
            model_dir=model_dir,
            tf_random_seed=seed if random_seed is None else random_seed,
            save_summary_steps=save_summary_steps,
            save_checkpoints_steps=save_checkpoints_steps,
            save_checkpoints_secs=save_checkpoints_secs,
            session_config=session_config,
            keep_checkpoint_max=keep_checkpoint_max,
            keep_checkpoint_every_n_hours=hours,
            log_step_count_steps=log_step_count_steps,
            checkpoint_fallback=fallback,
            **more,
        )

    def _validate(self):
        super()._validate()
        self.iterations_per_loop = check_int("iterations_per_loop", self.iterations_per_loop, 1)
        self.compute_dtype = precision_dtype(self.precision_mode, self.precision_mode_v2)
        exp = self.experimental_config
        if exp is not None and not isinstance(exp, ExperimentalConfig):
            raise ValueError(
                "`experimental_config` must be None or an ExperimentalConfig. "
                f"Received: experimental_config={exp!r}"
            )
        self.accelerate_mode = None if exp is None else exp.accelerate_mode
        if self.accelerate_mode is not None:
            check_precision_compatibility(
                self.accelerate_mode, self.precision_mode, self.precision_mode_v2
            )

    def _kwargs(self) -> dict:
        return {
            f: getattr(self, "tf_random_seed" if f == "random_seed" else f) for f in self._FIELDS
        }
