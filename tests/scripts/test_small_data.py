"""train.py on data smaller than one batch, and what it evaluates on."""

import concurrent.futures
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from npu_rec.data import read_all
from npu_rec.scripts import _data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(make_source):
    with make_source() as source:
        columns = read_all(source)
    return {
        tuple(np.round([columns[f"I{i}"][j] for i in range(1, 14)], 4).tolist())
        + tuple(columns[f"C{i}"][j] for i in range(1, 27))
        for j in range(len(columns["label"]))
    }, len(columns["label"])


def test_sample_without_eval_data_holds_rows_out_of_training():
    plan = _data.plan("criteo_sample")
    train, n_train = _rows(plan.train_source)
    held, n_held = _rows(plan.eval_source)
    assert (n_train, n_held) == (180, 20)  # one row in 10 of the 200
    assert not train & held  # no evaluated row is trained on
    assert "held out from training" in plan.eval_name and "--eval_data" in plan.eval_name


def test_files_with_eval_data_evaluate_that_data(tmp_path):
    lines = open(os.path.join(ROOT, "npu_rec/data/samples/criteo_sample.txt")).read().split("\n")
    (tmp_path / "train.csv").write_text("\n".join(lines[:150]) + "\n")
    (tmp_path / "eval.csv").write_text("\n".join([lines[0]] + lines[150:]))
    roles = dict(
        label="label",
        dense=[f"I{i}" for i in range(1, 14)],
        categorical=[f"C{i}" for i in range(1, 27)],
    )
    plan = _data.plan(str(tmp_path / "train.csv"), eval_data=str(tmp_path / "eval.csv"), **roles)
    assert _rows(plan.train_source)[1] == 149 and _rows(plan.eval_source)[1] == 51
    assert plan.eval_name == f"--eval_data={tmp_path / 'eval.csv'}"
    held = _data.plan(str(tmp_path / "train.csv"), **roles)
    assert _rows(held.train_source)[1] + _rows(held.eval_source)[1] == 149


def _train_on_the_sample(frontend, model_dir):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "npu_rec.scripts.train",
            "--data=criteo_sample",
            f"--frontend={frontend}",
            "--max_steps=5",
            "--eval_steps=2",
            f"--model_dir={model_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory):
    """frontend -> (finished process, model_dir) of train.py on the criteo sample with the
    default --batch_size: both front ends' processes run side by side, once."""
    dirs = {f: tmp_path_factory.mktemp(f) / "run" for f in ("keras", "estimator")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = dict(zip(dirs, pool.map(_train_on_the_sample, dirs, dirs.values()), strict=True))
    return {f: (done[f], dirs[f]) for f in dirs}


@pytest.mark.parametrize("frontend", ["keras", "estimator"])
def test_train_on_the_criteo_sample_finishes_with_the_default_batch_size(frontend, sample_runs):
    result, model_dir = sample_runs[frontend]
    output = result.stdout + result.stderr[-3000:]
    assert result.returncode == 0, output
    assert "has 180 rows, fewer than --batch_size=1024" in result.stdout, output
    assert "evaluating on the rows of criteo_sample held out from training" in result.stdout
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 5 and np.isfinite(metrics["eval_loss"])
