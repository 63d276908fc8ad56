"""evaluate.py, export.py, inspect_checkpoint.py and online_train.py on tiny runs."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

from scripts import _checkpoints, evaluate, export, inspect_checkpoint, online_train, train

EST = dict(frontend="estimator", batch_size=128, eval_steps=2, save_steps=10, verbose=0)


@pytest.fixture(scope="module")
def incremental_run(tmp_path_factory):
    """An Estimator run to step 30 with incremental (full + delta) checkpoints."""
    model_dir = tmp_path_factory.mktemp("incremental")
    with flagsaver.flagsaver(**EST, max_steps=30, model_dir=str(model_dir),
                             incremental_checkpoint=True, save_delta_checkpoints_secs=1,
                             save_checkpoint_due_time=2, access_threshold=1):
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
    with flagsaver.flagsaver(**EST, max_steps=40, model_dir=str(incremental_run),
                             restore_model_version=10, access_threshold=1):
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
    common = dict(batch_size=128, eval_steps=2, save_steps=10, verbose=0, evict_steps=5,
                  model_dir=str(model_dir), save_delta_checkpoints_secs=1,
                  save_checkpoint_due_time=2)
    with flagsaver.flagsaver(**common, max_steps=20):
        online_train.main(["online_train.py"])
    assert 20 in _checkpoints.restorable_versions(str(model_dir))
    with flagsaver.flagsaver(**common, max_steps=25):
        online_train.main(["online_train.py"])
    m = json.loads((model_dir / "metrics.json").read_text())
    assert m["start_step"] == 20 and m["global_step"] == 25
    assert "eval_auc=" in capsys.readouterr().out
