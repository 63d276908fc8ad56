"""evaluate.py, export.py, inspect_checkpoint.py and online_train.py on tiny runs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from absl import app
from absl.testing import flagsaver

from npu_rec.scripts import _checkpoints, evaluate, export, inspect_checkpoint, online_train, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EST = dict(frontend="estimator", batch_size=128, eval_steps=2, save_steps=10, verbose=0)


@pytest.fixture(scope="module")
def incremental_run(tmp_path_factory):
    """An Estimator run to step 30 with incremental (full + delta) checkpoints."""
    model_dir = tmp_path_factory.mktemp("incremental")
    with flagsaver.flagsaver(
        **EST,
        max_steps=30,
        model_dir=str(model_dir),
        incremental_checkpoint=True,
        save_delta_checkpoints_secs=1,
        save_checkpoint_due_time=2,
        access_threshold=1,
    ):
        train.main(["train.py"])
    return model_dir


def test_inspect_lists_the_versions_an_incremental_run_left(incremental_run, capsys):
    with flagsaver.flagsaver(model_dir=str(incremental_run), json=True):
        inspect_checkpoint.main(["inspect_checkpoint.py"])
    info = json.loads(capsys.readouterr().out)
    files = sorted(f for f in os.listdir(incremental_run / "tables") if f.endswith(".nrc"))
    listed = [f"ckpt-{v['step']:012d}.{v['kind']}.nrc" for v in info["versions"]]
    assert listed == files
    assert {10, 20, 30} <= set(info["restore_model_version"])
    assert set(info["tables"]) == {"categorical", "categorical_linear"}
    assert info["tables"]["categorical"]["rows"] > 100
    for v in info["versions"]:
        if v["kind"] == "delta":
            assert v["parent"] is not None and v["parent"] < v["step"]


def test_train_resumes_from_restore_model_version(incremental_run):
    with flagsaver.flagsaver(
        **EST,
        max_steps=40,
        model_dir=str(incremental_run),
        restore_model_version=10,
        access_threshold=1,
    ):
        train.main(["train.py"])
    m = json.loads((incremental_run / "metrics.json").read_text())
    assert m["start_step"] == 10 and m["steps"] == 30 and m["global_step"] == 40


def test_evaluate_and_export_a_trained_run(incremental_run, tmp_path, capsys):
    flags_ = dict(**EST, model_dir=str(incremental_run), access_threshold=1)
    with flagsaver.flagsaver(**flags_):
        evaluate.main(["evaluate.py"])
    out = json.loads((incremental_run / "eval_metrics.json").read_text())
    assert out["global_step"] >= 30 and 0 <= out["eval_auc"] <= 1
    assert "eval_auc=" in capsys.readouterr().out
    with flagsaver.flagsaver(**flags_, export_dir=str(tmp_path / "serving")):
        path = export.main(["export.py"]) or export.run()
    serve = tf.saved_model.load(path).signatures["serving_default"]
    batch = {f"I{i}": tf.constant([1.0, 2.0]) for i in range(1, 14)}
    batch.update({f"C{i}": tf.constant([7, 2**62], tf.int64) for i in range(1, 27)})
    probs = serve(**batch)["probabilities"].numpy()
    assert probs.shape == (2,) and np.all((probs > 0) & (probs < 1))


def test_online_train_checkpoints_and_resumes(tmp_path, capsys):
    model_dir = tmp_path / "online"
    common = dict(
        batch_size=128,
        eval_steps=2,
        save_steps=10,
        verbose=0,
        evict_steps=5,
        model_dir=str(model_dir),
        save_delta_checkpoints_secs=1,
        save_checkpoint_due_time=2,
    )
    with flagsaver.flagsaver(**common, max_steps=20):
        online_train.main(["online_train.py"])
    assert 20 in _checkpoints.restorable_versions(str(model_dir))
    with flagsaver.flagsaver(**common, max_steps=25):
        online_train.main(["online_train.py"])
    m = json.loads((model_dir / "metrics.json").read_text())
    assert m["start_step"] == 20 and m["global_step"] == 25
    assert "eval_auc=" in capsys.readouterr().out


@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory):
    """A tiny Estimator DLRM run with 16-wide embeddings (not the defaults)."""
    model_dir = tmp_path_factory.mktemp("dlrm")
    with flagsaver.flagsaver(
        **EST, max_steps=4, model_dir=str(model_dir), model="dlrm", embedding_dim=16
    ):
        train.main(["train.py"])
    return model_dir


def test_evaluate_and_export_take_the_model_flags_of_the_run(dlrm_run, tmp_path):
    with flagsaver.flagsaver(model_dir=str(dlrm_run), eval_steps=1, verbose=0):
        evaluate.main(["evaluate.py"])
    out = json.loads((dlrm_run / "eval_metrics.json").read_text())
    assert out["model"] == "dlrm" and out["frontend"] == "estimator" and out["global_step"] == 4
    with flagsaver.flagsaver(model_dir=str(dlrm_run), export_dir=str(tmp_path / "serving")):
        path = export.run()
    assert os.path.exists(os.path.join(path, "saved_model.pb"))


@pytest.mark.parametrize("script", [evaluate, export, train])
@pytest.mark.parametrize(
    "flag, value, recorded",
    [("model", "wdl", "dlrm"), ("embedding_dim", 8, 16), ("frontend", "keras", "estimator")],
)
def test_a_model_flag_conflicting_with_the_run_is_refused_naming_both(
    dlrm_run, tmp_path, script, flag, value, recorded
):
    message = (
        rf"^--{flag}={value} conflicts with --{flag}={recorded} of the training run in "
        rf"--model_dir={dlrm_run} \(run_flags.json\): leave --{flag} out to use the "
        r"run's value, or give another --model_dir\.$"
    )
    with flagsaver.flagsaver(
        model_dir=str(dlrm_run), export_dir=str(tmp_path / "x"), max_steps=8, **{flag: value}
    ):
        with pytest.raises(app.UsageError, match=message):
            script.main([script.__name__])
    assert not (tmp_path / "x").exists()


def test_data_with_other_columns_is_refused(dlrm_run):
    with flagsaver.flagsaver(model_dir=str(dlrm_run), data="movielens_sample"):
        with pytest.raises(
            app.UsageError,
            match=r"--data=movielens_sample has label columns "
            r"rating but the training run in .* used label",
        ):
            evaluate.main(["evaluate.py"])


def test_the_conflict_is_one_line_without_a_traceback(dlrm_run):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "npu_rec.scripts.evaluate",
            f"--model_dir={dlrm_run}",
            "--model=wdl",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 1
    lines = [x for x in out.stderr.splitlines() if x.strip() and "--model" in x]
    assert lines == [
        f"npu_rec: error: --model=wdl conflicts with --model=dlrm of the training run in "
        f"--model_dir={dlrm_run} (run_flags.json): leave --model out to use the "
        "run's value, or give another --model_dir."
    ], out.stderr[-3000:]
    assert "Traceback" not in out.stderr


def test_a_model_dir_without_checkpoints_takes_new_model_flags(tmp_path):
    model_dir = tmp_path / "aborted"
    model_dir.mkdir()
    (model_dir / "run_flags.json").write_text(json.dumps({"model": "dlrm", "embedding_dim": 16}))
    with flagsaver.flagsaver(**EST, max_steps=2, model_dir=str(model_dir), model="wdl"):
        train.main(["train.py"])
    record = json.loads((model_dir / "run_flags.json").read_text())
    assert record["model"] == "wdl" and record["embedding_dim"] == 8
    assert record["columns"]["categorical"][:2] == ["C1", "C2"]
