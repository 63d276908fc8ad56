"""The chief's pause barrier on the ps route: every save is a consistent cut of the cluster.

The workers train asynchronously; without a barrier, a save that reads the
positions, the dense variables and then the tables while workers apply their
batches could hold a batch in the model state but not in its trainer's
position (or part of a batch on one table shard and not on another). Around
each save the chief pauses the workers (`PauseBarrier.paused`):

1. it sets the request variable (on ps task 0) to a new generation `g`;
2. each worker fetches the request in every training run (`PauseHook`, one
   scalar read alongside the step); after a run that saw `g`, the run's
   updates and its position being complete, it acknowledges `g` (its own
   state variable) and waits until the request changes;
3. the chief waits until every started worker has acknowledged `g` or has
   finished training (a worker's state says so from its session's end, before
   its "done" token), saves, then releases (request 0).

A started worker that does not acknowledge within `PAUSE_TIMEOUT_SECS` (lost,
or stuck) makes the chief raise an error naming it: no hang. A worker that
does not start before the request sees it at its session start and waits
there. The chief itself saves between its own steps. The cost is one pause
per save (the longest step of a worker plus the save; docs/distributed.md,
"Each trainer's reading position").
"""

from __future__ import annotations

import contextlib
import time

import tensorflow as tf

from npu_rec import _log as logging

#: How long the chief waits for every started worker to acknowledge a pause (s).
PAUSE_TIMEOUT_SECS = 60.0
#: How long a paused worker waits for the chief's release (s).
RELEASE_TIMEOUT_SECS = 3600.0
#: How often the chief polls the workers' acknowledgements (s).
POLL_SECS = 0.005
#: How often a paused worker polls for the release (s): seldom, not to slow the save.
RELEASE_POLL_SECS = 0.05
_PREFIX = "npu_rec_pause"
#: A worker's state before its session starts, and after its training ended.
NOT_STARTED, FINISHED = -2, -1


class PauseBarrier:
    """The pause request and each worker's state (variables on ps task 0, in no collection).

    Args:
      workers: The worker tasks' names (`"worker:0"`, ...), the chief excluded.
      device: Where the variables live (`"/job:ps/task:0"`).
    """

    def __init__(self, workers: list[str], device: str):
        self.workers = list(workers)
        with tf.compat.v1.device(device):
            self.request = self._variable("request")
            self.states = {w: self._variable(w.replace(":", "_")) for w in self.workers}
        self._generation = 0
        self._value = tf.compat.v1.placeholder(tf.int64, [], name=f"{_PREFIX}_value")
        self._set_request = self.request.assign(self._value, read_value=False)
        self._set_state = {
            w: v.assign(self._value, read_value=False) for w, v in self.states.items()
        }
        self.read_request = self.request.read_value()
        self._read_states = {w: v.read_value() for w, v in self.states.items()}
        self._reset = tf.group(
            [self.request.assign(0, read_value=False)]
            + [v.assign(NOT_STARTED, read_value=False) for v in self.states.values()]
        )
        self._release = self.request.assign(0, read_value=False)
        self._initialized = tf.compat.v1.is_variable_initialized(self.request)

    @staticmethod
    def _variable(name):
        return tf.compat.v1.Variable(
            tf.constant(0, tf.int64),
            trainable=False,
            name=f"{_PREFIX}_{name}",
            collections=[],
            use_resource=True,
        )

    def reset(self, session) -> None:
        """The chief, before the workers may start: no request, no worker started.

        (A chief whose session is re-created while the ps tasks keep their state
        only releases a pause: the workers' states stay as they are.)
        """
        session.run(self._release if session.run(self._initialized) else self._reset)

    def set_state(self, session, worker: str, value: int) -> None:
        session.run(self._set_state[worker], {self._value: value})

    @contextlib.contextmanager
    def paused(self, session, timeout_secs: float | None = None):
        """The chief: every started worker paused inside (finished ones count as paused).

        Raises:
          RuntimeError: a started worker did not acknowledge within `timeout_secs`
            (default `PAUSE_TIMEOUT_SECS`); the message names it.
        """
        if not self.workers:
            yield
            return
        timeout = PAUSE_TIMEOUT_SECS if timeout_secs is None else timeout_secs
        self._generation += 1
        g = self._generation
        start = time.monotonic()
        session.run(self._set_request, {self._value: g})
        try:
            while True:
                states = session.run(self._read_states)
                waiting = sorted(
                    w for w, s in states.items() if s not in (g, FINISHED, NOT_STARTED)
                )
                if not waiting:
                    break
                if time.monotonic() - start > timeout:
                    raise RuntimeError(
                        f"Lost task(s) {', '.join(waiting)}: no acknowledgement of the chief's "
                        f"pause for a checkpoint within {timeout:g} s (PAUSE_TIMEOUT_SECS). "
                        "The job stops; re-run the same command to resume from the last "
                        "checkpoint."
                    )
                time.sleep(POLL_SECS)
            waited = time.monotonic() - start
            yield
            logging.info(
                "npu_rec: the workers waited %.1f ms for the save (%.1f ms until all paused).",
                1e3 * (time.monotonic() - start),
                1e3 * waited,
            )
        finally:
            session.run(self._set_request, {self._value: 0})


class PauseHook(tf.compat.v1.train.SessionRunHook):
    """A worker's side of the barrier: acknowledges the chief's pause and waits for release.

    Args:
      barrier: The graph's `PauseBarrier`.
      name: This worker (`"worker:1"`).
    """

    def __init__(self, barrier: PauseBarrier, name: str):
        self.barrier, self.name = barrier, name

    def after_create_session(self, session, coord):
        self.barrier.set_state(session, self.name, 0)  # started: the chief now waits for it
        self._serve(session, int(session.run(self.barrier.read_request)))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.barrier.read_request)

    def after_run(self, run_context, run_values):
        self._serve(run_context.session, int(run_values.results))

    def end(self, session):
        self.barrier.set_state(session, self.name, FINISHED)

    def _serve(self, session, request: int) -> None:
        """Acknowledges `request` and waits while the chief keeps a pause requested."""
        start, acknowledged = time.monotonic(), 0
        while request != 0:
            if request != acknowledged:  # a new pause (the chief may pause again at once)
                self.barrier.set_state(session, self.name, request)
                acknowledged = request
            if time.monotonic() - start > RELEASE_TIMEOUT_SECS:
                raise RuntimeError(
                    f"{self.name} waited {RELEASE_TIMEOUT_SECS:g} s (RELEASE_TIMEOUT_SECS) "
                    "for the chief to end a checkpoint's pause: the chief is lost."
                )
            time.sleep(RELEASE_POLL_SECS)
            request = int(session.run(self.barrier.read_request))
