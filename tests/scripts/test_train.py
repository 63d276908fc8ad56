import json

from absl.testing import flagsaver

from scripts import train


def test_train_script_learns_synthetic_data_and_writes_metrics(tmp_path, capsys):
    model_dir = tmp_path / "run"
    with flagsaver.flagsaver(
        batch_size=512, max_steps=150, eval_rows=8192, model_dir=str(model_dir), verbose=0
    ):
        train.main(["train.py"])
    printed = capsys.readouterr().out
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["eval_auc"] > 0.6
    assert metrics["samples_per_sec"] > 0
    assert f"eval_auc={metrics['eval_auc']:.4f}" in printed
    assert (model_dir / "model.keras").exists()


def test_train_script_runs_on_the_shipped_criteo_sample(tmp_path, capsys):
    model_dir = tmp_path / "criteo"
    with flagsaver.flagsaver(
        data="criteo_sample",
        batch_size=32,
        max_steps=10,
        hash_buckets=256,
        model_dir=str(model_dir),
        verbose=0,
    ):
        train.main(["train.py"])
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["data"] == "criteo_sample" and metrics["steps"] == 10
    assert 0.0 <= metrics["eval_auc"] <= 1.0 and metrics["eval_loss"] > 0
    assert "eval_auc=" in capsys.readouterr().out
