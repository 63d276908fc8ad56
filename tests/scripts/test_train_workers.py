"""`scripts/train.py` under `npu_rec.launch --workers 2`, then the same command resumes.

One scenario, its own process groups and a hard time limit: 2 workers train DeepFM
(Keras, admission and eviction on) to step 6 with saves every 3 steps, then the same command with
--max_steps=9 resumes both workers from step 6. The launcher runs in this process
(`launch.run`, what `python -m npu_rec.launch` calls; its command line is tested in
tests/distribute/test_launch.py): a launcher process would import TensorFlow for nothing.
"""

import io
import json
import os
import sys

import pytest

from npu_rec import launch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(model_dir, max_steps: int, *flags):
    env = {**os.environ, "PYTHONPATH": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    out = io.BytesIO()
    code = launch.run(
        [
            sys.executable,
            "-m",
            "npu_rec.scripts.train",
            f"--max_steps={max_steps}",
            "--save_steps=3",
            "--batch_size=32",
            "--eval_steps=2",
            f"--model_dir={model_dir}",
            *flags,
        ],
        workers=2,
        timeout_secs=200,
        out=out,
        env=env,
    )
    assert code == 0, out.getvalue().decode()[-8000:]
    return [json.load(open(model_dir / f"worker-{r}-of-2" / "metrics.json")) for r in (0, 1)]


@pytest.mark.timeout(600)
def test_train_script_runs_on_two_workers_and_resumes(tmp_path):
    # Admission and eviction on (the Evict callback runs on every worker every 3 steps).
    first = _launch(
        tmp_path, 6, "--access_threshold=1", "--eviction_threshold=86400", "--evict_steps=3"
    )
    assert [m["global_step"] for m in first] == [6, 6]
    assert first[0]["eval_loss"] == pytest.approx(first[1]["eval_loss"], abs=1e-6)
    for m in first:  # each worker holds its own part of every table
        assert all(n > 0 for n in m["table_sizes"].values())
    again = _launch(
        tmp_path, 9, "--access_threshold=1", "--eviction_threshold=86400", "--evict_steps=3"
    )
    assert [(m["start_step"], m["global_step"]) for m in again] == [(6, 9), (6, 9)]
