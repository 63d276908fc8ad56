"""The multi-worker `fit` scenarios, each run once per session: one process, then 2 workers.

Both runs happen in subprocesses (`fit_worker.py`; `keras_worker.py` for the tier and
the fallback scenarios, one after the other in the same processes), each with a hard
time limit and its own process group; the two-worker run goes through `npu_rec.launch`.
"""

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from npu_rec import launch

_WORKER = os.path.join(os.path.dirname(__file__), "fit_worker.py")
_KERAS_WORKER = os.path.join(os.path.dirname(__file__), "keras_worker.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    env = {**os.environ, "PYTHONPATH": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return env


def _run(args, timeout):
    proc = subprocess.run(
        [sys.executable, *args],
        env=_env(),
        capture_output=True,
        timeout=timeout,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stdout.decode()[-3000:] + proc.stderr.decode()[-3000:]


def run_scenario(script: str, out, workers: int = 2, timeout: int = 200, args=()) -> None:
    """Runs `script out *args` in one process, then on `workers` workers through `npu_rec.launch`.

    Each run must succeed; the single run gets `timeout` seconds, the launch 1.5 times that
    (2 times with 3 workers or more).
    """
    _run([script, str(out), *args], timeout=timeout)
    log = io.BytesIO()
    code = launch.run(
        [sys.executable, script, str(out), *args],
        workers=workers,
        timeout_secs=timeout * (3 if workers == 2 else 4) // 2,
        out=log,
        env=_env(),
    )
    assert code == 0, log.getvalue().decode()[-6000:]


class _Runs(tuple):
    """(one-process results, [worker 0, worker 1] results), and `.directory` of the files."""

    def __new__(cls, single, workers, directory):
        runs = super().__new__(cls, (single, workers))
        runs.directory = directory
        return runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fit")
    run_scenario(_WORKER, out)
    return _Runs(np.load(out / "single.npz"), [np.load(out / f"{r}.npz") for r in (0, 1)], out)


@pytest.fixture(scope="session")
def keras_scenarios(tmp_path_factory):
    """The directory of the tier and the fallback scenarios' files (`keras_worker.py`)."""
    out = tmp_path_factory.mktemp("keras_scenarios")
    run_scenario(_KERAS_WORKER, out, timeout=300, args=("tier", "fallback"))
    return out


def scenario_runs(out, name: str):
    """(one-process results, [worker 0, worker 1] results, directory) of scenario `name`."""
    single = np.load(out / f"{name}_single.npz")
    return single, [np.load(out / f"{name}_{r}.npz") for r in (0, 1)], out
