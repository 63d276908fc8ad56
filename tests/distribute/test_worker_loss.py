"""Kill one worker mid-run: the other stops naming it; the same command then resumes.

Two launches of `resume_worker.py` (each its own process groups, hard time limits):
worker 1 kills itself after step 25 (checkpoints every 10 steps), then the same job
runs again to step 60.
"""

import io
import json
import os
import re
import sys

import pytest

from npu_rec import launch

_WORKER = os.path.join(os.path.dirname(__file__), "resume_worker.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(directory, die_at: int, grace_secs: float = 0.0):
    env = {**os.environ, "PYTHONPATH": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    out = io.BytesIO()
    code = launch.run(
        [sys.executable, _WORKER, str(directory), str(die_at)],
        workers=2,
        timeout_secs=200,
        grace_secs=grace_secs,
        out=out,
        env=env,
    )
    return code, out.getvalue().decode()


@pytest.mark.timeout(600)
def test_a_lost_worker_stops_the_other_which_names_it_and_a_rerun_resumes(tmp_path):
    code, log = _launch(tmp_path, die_at=25, grace_secs=90)
    assert code == 9, log[-6000:]  # worker 1's os._exit(9)
    died = float(re.search(r"\[worker:1\] DIE (\S+)", log).group(1))
    lost = re.search(r"\[worker:0\] LOST (\S+) (.*)", log)
    assert lost, log[-6000:]
    assert float(lost.group(1)) - died < 60
    assert "lost worker task(s) worker:1 (127.0.0.1:" in lost.group(2)
    assert "re-run the same command" in lost.group(2)

    code, log = _launch(tmp_path, die_at=0)
    assert code == 0, log[-6000:]
    for rank in (0, 1):
        with open(tmp_path / f"final-{rank}.json") as f:
            final = json.load(f)
        assert final["restored_step"] == 20  # the last save before the loss
        assert final["global_step"] == 60
        # Every worker's reading position is where an uninterrupted reader of its share
        # is after 60 batches: no sample lost or repeated.
        assert final["saved_state"]["payload"]["data"] == final["reference_state"]
        assert final["keys"] > 0
