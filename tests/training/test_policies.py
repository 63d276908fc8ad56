"""Tests of SavePolicy and EvictPolicy, the cadences hooks and callbacks share."""

import re

import pytest

import npu_rec
from npu_rec.training._policies import EvictPolicy, SavePolicy


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def run(policy, steps, times=None):
    """Drives `policy` like a hook: returns [(step, kind)] for every save it asks for."""
    saves = []
    for i, step in enumerate(steps):
        now = None if times is None else times[i]
        kind = policy.decide(step, now)
        if kind:
            policy.mark_saved(kind, step, now)
            saves.append((step, kind))
    return saves


# Step cadence.


def test_save_every_n_steps_from_zero():
    policy = SavePolicy(save_steps=100, clock=FakeClock())
    assert run(policy, range(1, 251)) == [(100, "full"), (200, "full")]


def test_step_boundaries_and_first_call():
    policy = SavePolicy(save_steps=100, clock=FakeClock())
    assert policy.decide(0) is None  # first call starts the policy at step 0
    assert policy.decide(99) is None
    assert policy.decide(100) == "full"
    assert policy.decide(100) == "full"  # asking does not change the policy
    policy.mark_saved("full", 100)
    assert policy.decide(100) is None
    assert policy.decide(199) is None
    assert policy.decide(200) == "full"


def test_steps_advancing_in_chunks_save_at_the_first_step_past_each_multiple():
    policy = SavePolicy(save_steps=100, clock=FakeClock())
    assert run(policy, range(0, 330, 30)) == [(120, "full"), (210, "full"), (300, "full")]


def test_resumed_run_keeps_the_multiples():
    policy = SavePolicy(save_steps=100, clock=FakeClock())
    policy.start(step=150)
    assert run(policy, range(151, 320)) == [(200, "full"), (300, "full")]


def test_first_step_can_save_when_it_reaches_a_multiple():
    policy = SavePolicy(save_steps=1, clock=FakeClock())
    assert run(policy, [1, 2, 3]) == [(1, "full"), (2, "full"), (3, "full")]


@pytest.mark.parametrize("save_steps", [None, -1, 0])
def test_no_step_cadence(save_steps):
    policy = SavePolicy(save_steps=save_steps, clock=FakeClock())
    assert run(policy, range(0, 10_000, 7)) == []


# Time cadence (incremental checkpoints).


def incremental(save_steps=None, full=60, delta=10):
    return SavePolicy(
        save_steps=save_steps,
        incremental=True,
        full_interval_secs=full,
        delta_interval_secs=delta,
        clock=FakeClock(),
    )


def test_first_time_save_is_full_until_a_full_base_exists():
    policy = incremental()
    policy.start(step=0, now=0)
    assert policy.decide(1, now=9.999) is None
    assert policy.decide(1, now=10) == "full"  # a delta needs a full save to build on
    policy.mark_saved("full", 1, now=10)
    assert policy.decide(2, now=19.9) is None
    assert policy.decide(2, now=20) == "delta"


def test_full_and_delta_at_their_intervals():
    policy = incremental()
    policy.start(step=0, now=0, has_full_save=True)
    times = [t * 0.5 for t in range(0, 2 * 130 + 1)]
    saves = run(policy, range(len(times)), times)
    kinds = [(times[step], kind) for step, kind in saves]
    assert kinds == [
        (10, "delta"),
        (20, "delta"),
        (30, "delta"),
        (40, "delta"),
        (50, "delta"),
        (60, "full"),
        (70, "delta"),
        (80, "delta"),
        (90, "delta"),
        (100, "delta"),
        (110, "delta"),
        (120, "full"),
        (130, "delta"),
    ]


def test_full_save_restarts_the_delta_cadence():
    policy = incremental(full=60, delta=25)
    policy.start(step=0, now=0, has_full_save=True)
    assert policy.decide(1, now=25) == "delta"
    policy.mark_saved("delta", 1, now=25)
    policy.mark_saved("full", 2, now=30)  # e.g. a step-triggered full save
    assert policy.decide(3, now=54.9) is None
    assert policy.decide(3, now=55) == "delta"


def test_step_trigger_and_time_triggers_combine():
    policy = incremental(save_steps=100, full=600, delta=60)
    policy.start(step=0, now=0, has_full_save=True)
    assert policy.decide(100, now=1) == "full"  # the step cadence
    assert policy.decide(50, now=60) == "delta"  # the delta cadence
    assert policy.decide(100, now=60) == "full"  # both due: full wins


def test_default_clock_is_used_without_now():
    clock = FakeClock(500.0)
    policy = SavePolicy(
        incremental=True, full_interval_secs=60, delta_interval_secs=10, clock=clock
    )
    policy.start(step=0, has_full_save=True)
    clock.t += 10
    assert policy.decide(1) == "delta"
    policy.mark_saved("delta", 1)
    clock.t += 9
    assert policy.decide(2) is None


def test_from_config_reads_init_settings():
    config = npu_rec.RecConfig(
        bind_cpu=False,
        save_steps=100,
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=60,
        save_delta_checkpoints_secs=10,
    )
    policy = SavePolicy.from_config(config, clock=FakeClock())
    assert (
        policy.save_steps,
        policy.incremental,
        policy.full_interval_secs,
        policy.delta_interval_secs,
    ) == (100, True, 60.0, 10.0)
    resolved = SavePolicy.from_config(npu_rec.RecConfig(bind_cpu=False), save_steps=50)
    assert resolved.save_steps == 50 and not resolved.incremental


def test_save_policy_validation():
    with pytest.raises(ValueError, match=re.escape("full_interval_secs=None")):
        SavePolicy(incremental=True, delta_interval_secs=10)
    with pytest.raises(ValueError, match=re.escape("Received: delta_interval_secs=0")):
        SavePolicy(incremental=True, full_interval_secs=10, delta_interval_secs=0)
    with pytest.raises(TypeError, match=re.escape("Received: save_steps=True")):
        SavePolicy(save_steps=True)
    with pytest.raises(ValueError, match=re.escape("Received: kind='partial'")):
        SavePolicy(save_steps=1).mark_saved("partial", 1, now=0)


# EvictPolicy.


def test_evict_by_steps():
    policy = EvictPolicy(step_interval=1000, clock=FakeClock())
    assert policy.due(0) is False
    assert policy.due(999) is False
    assert policy.due(1000) is True
    policy.mark_evicted(1000)
    assert policy.due(1999) is False
    assert policy.due(2000) is True


def test_evict_by_time_boundary():
    policy = EvictPolicy(time_interval=86400, clock=FakeClock())
    policy.start(step=0, now=0)
    assert policy.due(5, now=86399.9) is False
    assert policy.due(5, now=86400) is True
    policy.mark_evicted(5, now=86400)
    assert policy.due(6, now=86401) is False


def test_evict_either_trigger():
    policy = EvictPolicy(time_interval=100, step_interval=10, clock=FakeClock())
    policy.start(step=0, now=0)
    assert policy.due(10, now=1) is True  # steps first
    assert policy.due(3, now=100) is True  # time first
    assert policy.due(9, now=99) is False  # neither


def test_evict_first_call_starts_the_clock():
    clock = FakeClock(50.0)
    policy = EvictPolicy(time_interval=30, clock=clock)
    assert policy.due(1) is False
    clock.t = 79.9
    assert policy.due(2) is False
    clock.t = 80.0
    assert policy.due(3) is True


def test_evict_disabled_without_intervals():
    policy = EvictPolicy(clock=FakeClock())
    assert not any(policy.due(s, now=s * 1e6) for s in range(0, 10**6, 997))


def test_evict_policy_validation():
    with pytest.raises(ValueError, match=re.escape("Received: step_interval=0")):
        EvictPolicy(step_interval=0)
    with pytest.raises(ValueError, match=re.escape("Received: time_interval=-1")):
        EvictPolicy(time_interval=-1)
    with pytest.raises(TypeError, match=re.escape("Received: time_interval=True")):
        EvictPolicy(time_interval=True)
