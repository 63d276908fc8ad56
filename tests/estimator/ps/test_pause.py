"""The chief's pause barrier around saves on the ps route (`npu_rec/estimator/_ps/_pause.py`).

In one process: a thread plays a worker (its `PauseHook` after each step), the
test plays the chief. The cluster scenario (every row trained exactly once
across a killed worker and the resume) is `tests/distribute/test_ps_estimator.py`.
"""

import threading
import time

import pytest
import tensorflow as tf

from npu_rec.estimator._ps import _pause as _ps_pause

_WORKERS = ["worker:0", "worker:1"]


def _until(condition, secs=20):
    deadline = time.monotonic() + secs
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _barrier():
    barrier = _ps_pause.PauseBarrier(_WORKERS, "/cpu:0")
    return barrier, barrier.read_request


def test_a_started_worker_that_does_not_acknowledge_fails_the_save_naming_it():
    with tf.Graph().as_default():
        barrier, request = _barrier()
        with tf.compat.v1.Session() as session:
            barrier.reset(session)
            barrier.set_state(session, "worker:0", 0)  # started, then lost
            start = time.monotonic()
            with pytest.raises(RuntimeError, match=r"Lost task\(s\) worker:0: .* 0.3 s"):
                with barrier.paused(session, timeout_secs=0.3):
                    pytest.fail("saved without worker:0's acknowledgement")
            assert time.monotonic() - start < 5  # bounded: no hang
            assert session.run(request) == 0  # released for the others
            barrier.reset(session)  # a re-created chief session: the states stay
            assert session.run(barrier.states["worker:0"]) == 0
            # Not started (worker:1) and finished workers do not hold the save.
            barrier.set_state(session, "worker:0", _ps_pause.FINISHED)
            with barrier.paused(session, timeout_secs=0.3):
                assert session.run(request) == 2  # the second pause


def test_the_save_runs_while_every_started_worker_is_paused_then_they_go_on():
    steps, stop = [0], threading.Event()
    with tf.Graph().as_default():
        barrier, request = _barrier()
        with tf.compat.v1.Session() as session:
            barrier.reset(session)
            hook = _ps_pause.PauseHook(barrier, "worker:0")
            context = tf.compat.v1.train.SessionRunContext(None, session)

            def worker():
                hook.after_create_session(session, None)
                deadline = time.monotonic() + 30
                while not stop.is_set() and time.monotonic() < deadline:
                    seen = session.run(request)  # fetched with the step
                    steps[0] += 1  # the step's updates
                    values = tf.compat.v1.train.SessionRunValues(seen, None, None)
                    hook.after_run(context, values)
                hook.end(session)

            thread = threading.Thread(target=worker, daemon=True)
            thread.start()
            try:
                _until(lambda: steps[0] >= 3)
                for generation in (1, 2):  # two saves, one after the other
                    with barrier.paused(session, timeout_secs=10):
                        during = steps[0]
                        time.sleep(0.2)
                        assert steps[0] == during  # no step applied during the save
                        states = {w: session.run(barrier.states[w]) for w in _WORKERS}
                        assert states == {"worker:0": generation, "worker:1": -2}
                    after = steps[0]
                    _until(lambda after=after: steps[0] > after)  # released: it trains on
            finally:
                stop.set()
                thread.join(timeout=30)
            assert not thread.is_alive()
            assert session.run(barrier.states["worker:0"]) == _ps_pause.FINISHED
            with barrier.paused(session, timeout_secs=0.3):  # a finished worker counts as paused
                pass
