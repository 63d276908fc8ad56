"""NPURunConfig / ExperimentalConfig / EstimatorSpec / hooks: every rule's failing case."""

import re

import pytest
import tensorflow as tf

from npu_rec import _validation
from npu_rec import estimator as E
from npu_rec.estimator import _run_config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"save_checkpoints_steps": 0}, "`save_checkpoints_steps` must be None or an integer"),
        ({"save_checkpoints_steps": True}, "Received: save_checkpoints_steps=True"),
        ({"save_checkpoints_secs": -1}, "`save_checkpoints_secs` must be None or a number"),
        (
            {"save_checkpoints_steps": 10, "save_checkpoints_secs": 10},
            "Set only one of `save_checkpoints_steps` and `save_checkpoints_secs`",
        ),
        ({"save_summary_steps": -1}, "`save_summary_steps` must be"),
        ({"keep_checkpoint_max": -1}, "`keep_checkpoint_max` must be"),
        ({"log_step_count_steps": 0}, "`log_step_count_steps` must be"),
        ({"iterations_per_loop": 0}, "`iterations_per_loop` must be an integer"),
        ({"random_seed": -1}, "`tf_random_seed` must be"),
        ({"random_seed": 1, "tf_random_seed": 2}, "`random_seed` and `tf_random_seed`"),
        ({"session_config": "x"}, "`session_config` must be None or a tf.compat.v1.ConfigProto"),
        ({"model_dir": ""}, "`model_dir` must be None or a non-empty path"),
        ({"precision_mode": "bogus"}, "`precision_mode` must be one of"),
        ({"precision_mode_v2": "bogus"}, "`precision_mode_v2` must be one of"),
        ({"precision_mode_v2": "mixed_hif8"}, "HiFloat8"),
        (
            {"precision_mode": "force_fp32", "precision_mode_v2": "origin"},
            "Set only one of `precision_mode` and `precision_mode_v2`",
        ),
        ({"experimental_config": "fast"}, "`experimental_config` must be None or an"),
        (
            {
                "precision_mode": "allow_mix_precision_bf16",
                "experimental_config": E.ExperimentalConfig(accelerate_train_mode="fast1|step|0.5"),
            },
            "can only be combined with `precision_mode`",
        ),
        (
            {
                "precision_mode_v2": "mixed_bfloat16",
                "experimental_config": E.ExperimentalConfig(accelerate_train_mode="fast1|step|0.5"),
            },
            "can only be combined with `precision_mode_v2`",
        ),
    ],
)
def test_run_config_rules(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        E.NPURunConfig(**kwargs)


@pytest.mark.parametrize(
    "mode, message",
    [
        ("fast", "must have 2 or 3 '|'-separated fields"),
        ("slow|step", "The type field"),
        ("fast1|time", "The trigger field"),
        ("fast1|step|x", "The ratio field of `accelerate_train_mode` must be a number"),
        ("fast1|step|0.95", "must be in [0.2, 0.9]"),
        ("fast1|loss|1.6", "must be in [1.01, 1.5]"),
    ],
)
def test_accelerate_train_mode_rules(mode, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        E.ExperimentalConfig(accelerate_train_mode=mode)


def test_defaults_read_only_and_replace():
    config = E.NPURunConfig()
    assert config.checkpoint_steps == 100
    assert E.NPURunConfig(save_checkpoints_secs=60).checkpoint_steps is None
    with pytest.raises(AttributeError, match="read-only"):
        config.iterations_per_loop = 2
    assert config.replace(iterations_per_loop=4).iterations_per_loop == 4
    with pytest.raises(ValueError, match="unknown options"):
        config.replace(bogus=1)
    with pytest.raises(ValueError, match="`iterations_per_loop` must be"):
        config.replace(iterations_per_loop=0)


@pytest.mark.parametrize("cls", [E.RunConfig, E.NPURunConfig])
def test_replace_switches_between_checkpoint_steps_and_secs(cls):
    """As tf.estimator's RunConfig.replace: setting one cadence clears the other."""
    by_steps = cls(save_checkpoints_steps=10)
    by_secs = by_steps.replace(save_checkpoints_secs=60)
    assert (by_secs.save_checkpoints_secs, by_secs.save_checkpoints_steps) == (60, None)
    back = by_secs.replace(save_checkpoints_steps=20)
    assert (back.save_checkpoints_steps, back.save_checkpoints_secs) == (20, None)
    assert by_steps.replace(save_checkpoints_secs=None).save_checkpoints_steps == 10
    with pytest.raises(ValueError, match="Set only one of `save_checkpoints_steps`"):
        by_steps.replace(save_checkpoints_steps=5, save_checkpoints_secs=5)


@pytest.mark.parametrize(
    "setting, dtype",
    [
        ({"precision_mode": "allow_mix_precision_bf16"}, "bfloat16"),
        ({"precision_mode_v2": "mixed_bfloat16"}, "bfloat16"),
        ({"precision_mode": "force_fp32"}, None),
        ({"precision_mode": "must_keep_origin_dtype"}, None),
        ({"precision_mode_v2": "origin"}, None),
    ],
)
def test_precision_mode_maps_to_a_grappler_setting(setting, dtype):
    config = E.NPURunConfig(**setting)
    assert config.compute_dtype == dtype
    rewrite = _run_config.session_config_for(None, dtype).graph_options.rewrite_options
    assert bool(rewrite.auto_mixed_precision_onednn_bfloat16) == (dtype == "bfloat16")


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="CPU-only rule")
@pytest.mark.parametrize(
    "setting",
    [
        {"precision_mode": "allow_mix_precision"},
        {"precision_mode_v2": "fp16"},
        {"experimental_config": E.ExperimentalConfig(accelerate_train_mode="fast|step|0.5")},
    ],
)
def test_float16_uses_the_cpu_emulation_of_the_amp_pass_without_gpu(setting):
    config = E.NPURunConfig(**setting)
    dtype = config.compute_dtype or config.accelerate_mode.dtype
    assert dtype == "float16"
    rewrite = _run_config.session_config_for(None, dtype).graph_options.rewrite_options
    assert rewrite.auto_mixed_precision_cpu and not rewrite.auto_mixed_precision
    # The passes that could reorder the graph before the AMP pass are off.
    assert rewrite.disable_model_pruning
    assert rewrite.constant_folding == rewrite.OFF
    assert rewrite.common_subgraph_elimination == rewrite.OFF


def test_npu_only_and_unknown_options_warn_once():
    _validation.forget_logged()
    with pytest.warns(
        UserWarning, match=r"\['hcom_parallel'\] configure the Ascend NPU only"
    ) as got:
        E.NPURunConfig(hcom_parallel=True)
        E.NPURunConfig(hcom_parallel=True)
    assert len([w for w in got if "Ascend NPU only" in str(w.message)]) == 1
    with pytest.warns(UserWarning, match=r"unknown options \['bogus'\]"):
        E.NPURunConfig(bogus=1)


def test_estimator_spec_rules():
    with tf.Graph().as_default():
        loss = tf.constant(1.0)
        with pytest.raises(ValueError, match="`loss` is required in mode 'train'"):
            E.EstimatorSpec(E.ModeKeys.TRAIN, train_op=tf.no_op())
        with pytest.raises(ValueError, match="`train_op` is required"):
            E.EstimatorSpec(E.ModeKeys.TRAIN, loss=loss)
        with pytest.raises(ValueError, match="`predictions` are required"):
            E.EstimatorSpec(E.ModeKeys.PREDICT)
        with pytest.raises(ValueError, match="`loss` must be a scalar"):
            E.EstimatorSpec(E.ModeKeys.EVAL, loss=tf.zeros([3]))
        with pytest.raises(ValueError, match="`mode` must be one of"):
            E.EstimatorSpec("bogus", loss=loss)
        with pytest.raises(TypeError, match="must be a \\(value, update_op\\) pair"):
            E.EstimatorSpec(E.ModeKeys.EVAL, loss=loss, eval_metric_ops={"m": 3})
        with pytest.raises(TypeError, match="`training_hooks` must hold SessionRunHooks"):
            E.EstimatorSpec(E.ModeKeys.EVAL, loss=loss, training_hooks=[1])
    with tf.Graph().as_default():
        other = tf.constant(2.0)
    with tf.Graph().as_default(), pytest.raises(ValueError, match="must be from the default"):
        E.EstimatorSpec(E.ModeKeys.EVAL, loss=other)


def test_specs_and_hooks_rules():
    with pytest.raises(ValueError, match="`max_steps` must be"):
        E.TrainSpec(lambda: None, max_steps=0)
    with pytest.raises(TypeError, match="`input_fn` must be callable"):
        E.EvalSpec(3)
    with pytest.raises(ValueError, match="`steps` must be"):
        E.EvalSpec(lambda: None, steps=0)
    with pytest.raises(ValueError, match="needs either `step` and `total_step`"):
        E.TellMeStepOrLossHook()
    with pytest.raises(ValueError, match="needs both `step` and `total_step`"):
        E.TellMeStepOrLossHook(step="global_step:0")
    with pytest.raises(ValueError, match="needs both `loss` and `final_loss`"):
        E.TellMeStepOrLossHook(loss="loss:0")
    with pytest.raises(TypeError, match="`evict_enable` must be a bool"):
        E.EvictHook(evict_enable=1)
    with pytest.raises(ValueError, match="`step_interval` must be"):
        E.EvictHook(evict_step_interval=0)
    with pytest.raises(ValueError, match="`time_interval` must be"):
        E.EvictHook(evict_time_interval=0)
    with pytest.raises(TypeError, match="`model_fn` must be callable"):
        E.NPUEstimator(3)
