"""Accelerated training: low precision first, one switch to float32, nothing lost."""

import glob

import numpy as np
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import estimator as E
from tests.estimator import models

PARAMS = {"dim": 4, "hidden": (16,), "lr": 0.01}


def _estimator(tmp_path, mode=None, **config):
    exp = None if mode is None else E.ExperimentalConfig(accelerate_train_mode=mode)
    return E.NPUEstimator(
        models.deepfm_model_fn,
        params=PARAMS,
        config=E.NPURunConfig(
            model_dir=str(tmp_path),
            random_seed=1,
            experimental_config=exp,
            save_summary_steps=1,
            log_step_count_steps=None,
            **config,
        ),
    )


def _input_fn():
    return models.synthetic_input_fn(0, 6400, batch_size=64, epochs=2)


def _loss_history(est, input_fn):
    return est.evaluate(input_fn, steps=20)["loss"]


def _precision_scalars(model_dir):
    scalars = {}
    for path in glob.glob(str(model_dir / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.tag == "npu_rec/low_precision":
                    scalars[event.step] = v.simple_value
    return scalars


@pytest.fixture(scope="module")
def float32_loss(tmp_path_factory):
    """Evaluation loss of a float32 run of 100 steps (the convergence reference)."""
    npu_rec.shutdown()
    est = _estimator(tmp_path_factory.mktemp("f32"))
    est.train(_input_fn(), max_steps=100)
    loss = _loss_history(est, models.synthetic_input_fn(6400, 9600))
    npu_rec.shutdown()
    return loss


_LOW = {"fast": "float16", "fast1": "bfloat16"}


@pytest.fixture(scope="module", params=sorted(_LOW))
def half_low(request, tmp_path_factory):
    """(kind, model_dir, estimator, hook) of a `kind|step|0.5` run of 40 steps.

    Steps 0-19 run in low precision, 20-39 in float32; checkpoint 20 is the
    hand-over. The tests below only read the run (one run per kind, not one per test).
    """
    npu_rec.shutdown()
    model_dir = tmp_path_factory.mktemp(request.param)
    est = _estimator(model_dir, f"{request.param}|step|0.5")
    hook = E.TellMeStepOrLossHook(step="global_step:0", total_step=40)
    est.train(_input_fn(), hooks=[hook], max_steps=40)
    npu_rec.shutdown()
    return request.param, model_dir, est, hook


def test_step_trigger_runs_half_in_low_precision_then_float32(half_low):
    kind, model_dir, est, hook = half_low
    dtype = _LOW[kind]
    assert hook.history == [(s, dtype) for s in range(20)] + [(s, "float32") for s in range(20, 40)]
    assert est.precision_history == hook.history
    # The TensorBoard scalar npu_rec/low_precision holds the same per-step record.
    assert _precision_scalars(model_dir) == {s: (1.0 if s < 20 else 0.0) for s in range(40)}
    assert tf.train.load_variable(est.latest_checkpoint(), "global_step") == 40


@pytest.mark.parametrize("kind", ["fast", "fast1"])
def test_converges_like_float32(tmp_path, float32_loss, kind):
    """90% of the steps in low precision: final loss within 5% of float32's."""
    est = _estimator(tmp_path, f"{kind}|step|0.9")
    est.train(_input_fn(), max_steps=100)
    assert sum(d != "float32" for _, d in est.precision_history) == 90
    got = _loss_history(est, models.synthetic_input_fn(6400, 9600))
    assert abs(got - float32_loss) / float32_loss < 0.05


def test_step_trigger_without_hook_uses_global_step_and_max_steps(tmp_path):
    est = _estimator(tmp_path, "fast1|step|0.3")
    est.train(_input_fn(), max_steps=20)
    assert [d for _, d in est.precision_history] == ["bfloat16"] * 6 + ["float32"] * 14


def test_switch_loses_no_weight_slot_or_row(half_low, tmp_path):
    """The float32 phase starts from exactly the state the low phase ended with."""
    _, model_dir, est, _ = half_low
    ckpt20 = str(model_dir / "model.ckpt-20")  # the switch at step 20: the hand-over
    names = [n for n, _ in tf.train.list_variables(ckpt20)]
    assert any("Adam" in n for n in names)  # optimizer slots are in the hand-over
    assert sorted(glob.glob(str(model_dir / "tables" / "*.nrc")))[0].endswith("000020.full.nrc")
    # Resuming at 20 in float32 from the hand-over checkpoint gives the same step 40.
    import shutil

    shutil.copytree(
        model_dir,
        tmp_path / "f32",
        ignore=lambda d, names: [
            n for n in names if "-40" in n or "000040" in n or n == "npu_rec_precision.json"
        ],
    )
    (tmp_path / "f32" / "checkpoint").write_text(
        'model_checkpoint_path: "model.ckpt-20"\nall_model_checkpoint_paths: "model.ckpt-20"\n'
    )
    est_f32 = _estimator(tmp_path / "f32")
    est_f32.train(_input_fn(), max_steps=40)
    for name in names:
        if "loss_scale" in name:  # float16 phase only: float32 graphs have no scale
            continue
        np.testing.assert_allclose(
            est_f32.get_variable_value(name), est.get_variable_value(name), atol=1e-6
        )


@pytest.mark.parametrize("kind, dtype", [("fast", "float16"), ("fast1", "bfloat16")])
def test_loss_trigger_switches_after_first_step_at_or_below_target(tmp_path, kind, dtype):
    est = _estimator(tmp_path, f"{kind}|loss|1.5")
    losses = []

    class Record(tf.compat.v1.train.SessionRunHook):
        def before_run(self, run_context):
            return tf.compat.v1.train.SessionRunArgs("loss:0")

        def after_run(self, run_context, run_values):
            losses.append(run_values.results)

    hook = E.TellMeStepOrLossHook(loss="loss:0", final_loss=0.35)
    est.train(_input_fn(), hooks=[Record(), hook], max_steps=60)
    target = 1.5 * 0.35
    first = next(i for i, v in enumerate(losses) if 0 < v <= target)
    dtypes = [d for _, d in hook.history]
    assert dtypes == [dtype] * (first + 1) + ["float32"] * (60 - first - 1)


def test_loss_trigger_without_hook_is_an_error(tmp_path):
    est = _estimator(tmp_path, "fast1|loss|1.05")
    with pytest.raises(ValueError, match="needs a TellMeStepOrLossHook"):
        est.train(_input_fn(), max_steps=5)


def test_step_trigger_without_total_is_an_error(tmp_path):
    est = _estimator(tmp_path, "fast1|step|0.5")
    with pytest.raises(ValueError, match="needs the total step count"):
        est.train(_input_fn())


def test_hook_of_the_other_trigger_is_an_error(tmp_path):
    est = _estimator(tmp_path, "fast1|step|0.5")
    with pytest.raises(ValueError, match="uses the 'step' trigger"):
        est.train(
            _input_fn(), hooks=[E.TellMeStepOrLossHook(loss="loss:0", final_loss=1.0)], max_steps=5
        )
