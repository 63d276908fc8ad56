import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_rec.training._precision import (
    AccelerateMode,
    PrecisionSwitch,
    check_precision_compatibility,
    parse_accelerate_train_mode,
)


@pytest.mark.parametrize(
    "text, dtype, trigger, ratio",
    [
        ("fast|step|0.9", "float16", "step", 0.9),
        ("fast1|step|0.2", "bfloat16", "step", 0.2),
        ("fast|step", "float16", "step", 0.9),
        ("fast1|loss", "bfloat16", "loss", 1.05),
        ("fast|loss|1.5", "float16", "loss", 1.5),
        ("fast1|loss|1.01", "bfloat16", "loss", 1.01),
    ],
)
def test_parse_valid_modes(text, dtype, trigger, ratio):
    mode = parse_accelerate_train_mode(text)
    assert (mode.dtype, mode.trigger, mode.ratio) == (dtype, trigger, ratio)
    assert mode.loss_scaling == (dtype == "float16")


@pytest.mark.parametrize(
    "text, match",
    [
        ("fast", "2 or 3 '|'-separated fields.*'fast'"),
        ("fast|step|0.5|x", "2 or 3"),
        ("slow|step|0.5", "type field.*'slow'"),
        ("fast|epoch|0.5", "trigger field.*'epoch'"),
        ("fast|step|abc", "ratio field.*must be a number.*'abc'"),
        ("fast|step|0.19", r"\[0.2, 0.9\].*'0.19'"),
        ("fast|step|0.91", r"\[0.2, 0.9\].*'0.91'"),
        ("fast|loss|1.0", r"\[1.01, 1.5\].*'1.0'"),
        ("fast1|loss|1.51", r"\[1.01, 1.5\].*'1.51'"),
    ],
)
def test_parse_invalid_modes_name_field_and_value(text, match):
    with pytest.raises(ValueError, match=match):
        parse_accelerate_train_mode(text)


def test_parse_rejects_non_strings():
    with pytest.raises(TypeError, match="accelerate_train_mode=0.9"):
        parse_accelerate_train_mode(0.9)


@pytest.mark.parametrize("pm", [None, "allow_fp32_to_fp16", "must_keep_origin_dtype"])
def test_compatible_precision_modes(pm):
    check_precision_compatibility(parse_accelerate_train_mode("fast|step"), pm, None)


@pytest.mark.parametrize(
    "pm, pm2, match",
    [
        ("force_fp16", None, "precision_mode='force_fp16'"),
        ("allow_mix_precision", None, "precision_mode='allow_mix_precision'"),
        (None, "mixed_float16", "precision_mode_v2='mixed_float16'"),
        (None, "fp16", "precision_mode_v2='fp16'"),
    ],
)
def test_incompatible_precision_modes(pm, pm2, match):
    with pytest.raises(ValueError, match=match):
        check_precision_compatibility(parse_accelerate_train_mode("fast|step"), pm, pm2)


def test_step_trigger_half_and_half():
    switch = PrecisionSwitch("fast1|step|0.5", total_step=100)
    precisions = [switch.is_low_precision(s) for s in range(100)]
    assert precisions == [True] * 50 + [False] * 50
    assert switch.switched_at == 50 and switch.low_dtype == "bfloat16"


@given(
    ratio=st.floats(0.2, 0.9),
    total=st.integers(1, 500),
    ipl=st.integers(1, 20),
)
def test_step_trigger_matches_the_rule_and_switches_once(ratio, total, ipl):
    mode = AccelerateMode("fast", "float16", "step", ratio)
    switch = PrecisionSwitch(mode, total_step=total, iterations_per_loop=ipl)
    steps = list(range(0, total, ipl))
    low = [switch.is_low_precision(s) for s in steps]
    expected_first_full = next(s for s in steps if s >= ratio * total or s + ipl >= total)
    assert low == [s < expected_first_full for s in steps]
    # Asking again (e.g. a hook and the summary writer) gives the same answers.
    assert [switch.is_low_precision(s) for s in steps] == low


def test_loss_trigger_switches_after_the_first_step_at_or_below_target():
    switch = PrecisionSwitch("fast|loss|1.1", final_loss=0.5)  # target 0.55
    losses = [0.9, 0.7, 0.56, 0.55, 0.8, 0.4]
    low = []
    for step, loss in enumerate(losses):
        low.append(switch.is_low_precision(step))
        switch.observe_loss(step, loss)
    assert low == [True, True, True, True, False, False]
    assert switch.switched_at == 4


def test_loss_trigger_ignores_non_positive_losses():
    switch = PrecisionSwitch("fast|loss|1.05", final_loss=1.0)
    switch.observe_loss(0, 0.0)
    switch.observe_loss(1, -1.0)
    assert not switch.switched and switch.is_low_precision(2)


def test_switch_state_survives_a_restart():
    first = PrecisionSwitch("fast|loss", final_loss=1.0)
    first.observe_loss(6, 0.9)
    second = PrecisionSwitch("fast|loss", final_loss=1.0)
    second.restore(first.state())
    assert not second.is_low_precision(7) and second.is_low_precision(6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="fast|step"), "total_step.*total_step=None"),
        (dict(mode="fast|step", total_step=0), "total_step=0"),
        (dict(mode="fast|step", total_step=True), "total_step=True"),
        (dict(mode="fast|loss"), "final_loss.*final_loss=None"),
        (dict(mode="fast|loss", final_loss=-1.0), "final_loss=-1.0"),
        (dict(mode="fast|step", total_step=10, iterations_per_loop=0), "iterations_per_loop=0"),
    ],
)
def test_switch_argument_errors(kwargs, match):
    mode = kwargs.pop("mode")
    with pytest.raises(ValueError, match=match):
        PrecisionSwitch(mode, **kwargs)
