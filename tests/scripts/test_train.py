import json
import os
import subprocess
import sys

import pytest
from absl import app, flags
from absl.testing import flagsaver

from npu_rec.scripts import _checkpoints, inspect_checkpoint, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(batch_size=256, max_steps=30, eval_steps=4, save_steps=20, verbose=0)


def _metrics(model_dir):
    return json.loads((model_dir / "metrics.json").read_text())


def test_keras_run_writes_checkpoints_events_metrics_and_report(tmp_path, capsys):
    model_dir = tmp_path / "run"
    report = tmp_path / "report.png"
    with flagsaver.flagsaver(**TINY, model_dir=str(model_dir), report=str(report)):
        train.main(["train.py"])
    printed = capsys.readouterr().out
    m = _metrics(model_dir)
    assert m["frontend"] == "keras" and m["global_step"] == 30
    assert f"eval_auc={m['eval_auc']:.4f}" in printed and "tables: 2" in printed
    assert m["samples_per_sec"] > 0 and m["peak_memory_mb"] > 0
    assert m["table_sizes"]["categorical"] > 1000
    # Versions 20 (save_steps) and 30 (training's end), tables and dense state.
    assert _checkpoints.restorable_versions(str(model_dir)) == [20, 30]
    assert os.listdir(model_dir / "events")[0].startswith("events.out.tfevents")
    assert report.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_run_resumes_from_the_model_dir(tmp_path):
    model_dir = tmp_path / "run"
    with flagsaver.flagsaver(**{**TINY, "max_steps": 20}, model_dir=str(model_dir)):
        train.main(["train.py"])
    with flagsaver.flagsaver(**TINY, model_dir=str(model_dir)):
        train.main(["train.py"])
    m = _metrics(model_dir)
    assert m["start_step"] == 20 and m["steps"] == 10 and m["global_step"] == 30


def test_estimator_run_on_the_shipped_criteo_sample(tmp_path, capsys):
    model_dir = tmp_path / "criteo"
    with flagsaver.flagsaver(
        frontend="estimator",
        data="criteo_sample",
        model="wdl",
        batch_size=32,
        max_steps=10,
        eval_steps=5,
        save_steps=10,
        model_dir=str(model_dir),
        verbose=0,
    ):
        train.main(["train.py"])
    m = _metrics(model_dir)
    assert m["data"] == "criteo_sample" and m["global_step"] == 10
    assert 0.0 <= m["eval_auc"] <= 1.0 and m["eval_loss"] > 0
    assert any(f.startswith("model.ckpt-10") for f in os.listdir(model_dir))
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(model_dir))
    assert "eval_auc=" in capsys.readouterr().out


def test_compact_tables_train_report_their_memory_and_resume_in_another_dtype(tmp_path, capsys):
    """--value_dtype / --sparse_optimizer reach the tables; the summary prints their memory."""
    from npu_rec.scripts import inspect_checkpoint

    model_dir = tmp_path / "compact"
    compact = dict(value_dtype="bfloat16", sparse_optimizer="rowwise_adagrad")
    with flagsaver.flagsaver(**{**TINY, "max_steps": 20}, **compact, model_dir=str(model_dir)):
        train.main(["train.py"])
    printed = capsys.readouterr().out
    memory = _metrics(model_dir)["table_memory"]["categorical"]
    assert memory["live_keys"] > 1000 and "table categorical memory: live_keys=" in printed
    full = {"live_keys", "rows", "slots", "metadata", "index", "bytes_per_live_key"}
    assert full <= set(memory)
    # bfloat16 rows (2 B per element, 8 per row) and one float32 accumulator per row.
    assert memory["rows"] == 4 * memory["slots"]
    with flagsaver.flagsaver(model_dir=str(model_dir)):
        info = inspect_checkpoint.run()
    table = info["tables"]["categorical"]
    assert table["value_dtype"] == "bfloat16" and table["memory"]["slots"] == 4 * table["rows"]
    assert "restored in memory: live_keys=" in capsys.readouterr().out
    # Another row dtype resumes (the checkpoint converts); another optimizer would not restore.
    with flagsaver.flagsaver(**TINY, value_dtype="float32", model_dir=str(model_dir)):
        train.main(["train.py"])
    m = _metrics(model_dir)
    assert m["global_step"] == 30 and m["start_step"] == 20
    resumed = m["table_memory"]["categorical"]
    assert resumed["rows"] == 8 * resumed["slots"]  # float32 rows now
    with pytest.raises(app.UsageError, match="--sparse_optimizer=adagrad conflicts"):
        with flagsaver.flagsaver(**TINY, sparse_optimizer="adagrad", model_dir=str(model_dir)):
            train.main(["train.py"])


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(eviction_threshold=60), "--eviction_threshold needs --access_threshold"),
        (dict(precision_mode="force_fp32"), "--precision_mode is an NPURunConfig setting"),
        (dict(format="parquet"), "--format applies to --data paths"),
        (dict(restore_model_version=5), "--restore_model_version needs --model_dir"),
        (dict(accelerate_train_mode="fast|sometimes"), "accelerate_train_mode"),
    ],
)
def test_bad_flag_combinations_fail_before_any_work(bad, message):
    with pytest.raises(flags.IllegalFlagValueError, match=message):
        with flagsaver.flagsaver(**bad):
            train.main(["train.py"])


def test_flag_bounds_name_the_flag():
    with flagsaver.flagsaver():
        with pytest.raises(flags.IllegalFlagValueError, match="max_steps"):
            flags.FLAGS["max_steps"].parse("0")
        with pytest.raises(flags.IllegalFlagValueError, match="pytorch"):
            flags.FLAGS["frontend"].parse("pytorch")


def test_estimator_and_keras_reach_the_same_auc_on_the_same_data(tmp_path):
    same = dict(batch_size=512, max_steps=150, eval_steps=24, save_steps=150, seed=3, verbose=0)
    auc = {}
    for frontend in ("keras", "estimator"):
        with flagsaver.flagsaver(**same, frontend=frontend, model_dir=str(tmp_path / frontend)):
            train.main(["train.py"])
        auc[frontend] = _metrics(tmp_path / frontend)["eval_auc"]
    assert auc["keras"] > 0.65 and auc["estimator"] > 0.65
    assert abs(auc["keras"] - auc["estimator"]) < 0.02, auc


def test_estimator_resume_continues_the_data_where_the_checkpoint_left_it(tmp_path):
    model_dir = tmp_path / "est_resume"
    with flagsaver.flagsaver(
        frontend="estimator",
        batch_size=16,
        max_steps=4,
        save_steps=2,
        eval_steps=1,
        model_dir=str(model_dir),
        verbose=0,
    ):
        train.main(["train.py"])
    positions = sorted(p.name for p in model_dir.glob("data_position-*.json"))
    assert positions == ["data_position-2.json", "data_position-4.json"]


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            dict(data="criteo_samples"),
            r"--data=criteo_samples: 'criteo_samples' is neither a data name nor an existing file; "
            r"did you mean --data=criteo_sample\?",
        ),
        (
            dict(data="/nonexistent.csv"),
            r"--data=/nonexistent.csv: '/nonexistent.csv' matches no file\. Give an existing file "
            r"or glob, or one of synthetic, criteo_sample",
        ),
        (
            dict(eval_data="/nonexistent/*.csv"),
            r"--eval_data=/nonexistent/\*.csv: '/nonexistent/\*.csv' matches no file\. Give an "
            r"existing file or glob",
        ),
    ],
)
def test_bad_data_paths_fail_at_parsing_naming_the_value_and_the_fix(bad, message):
    with pytest.raises(flags.IllegalFlagValueError, match=message):
        with flagsaver.flagsaver(**bad):
            pass


def test_a_model_dir_that_is_a_file_fails_at_parsing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    with pytest.raises(
        flags.IllegalFlagValueError,
        match=rf"--model_dir={blocker}/run: '{blocker}' is a file, not a "
        r"directory: give another --model_dir",
    ):
        with flagsaver.flagsaver(model_dir=str(blocker / "run")):
            pass
    assert blocker.read_text() == "keep me"


def test_a_bad_path_is_one_line_before_any_work(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "npu_rec.scripts.train",
            "--data=/nonexistent.csv",
            f"--model_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(tmp_path),
    )
    assert out.returncode != 0
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("npu_rec: error: flag --data=/nonexistent.csv: "), out.stderr
    assert "'/nonexistent.csv' matches no file" in lines[-1], out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "categorical_features" not in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("frontend", ["keras", "estimator"])
def test_rerun_after_max_steps_keeps_the_metrics_and_says_so(tmp_path, capsys, frontend):
    model_dir = tmp_path / frontend
    run = dict(TINY, max_steps=20, frontend=frontend, model_dir=str(model_dir))
    with flagsaver.flagsaver(**run):
        train.main(["train.py"])
    first = (model_dir / "metrics.json").read_text()
    capsys.readouterr()
    with flagsaver.flagsaver(**run):
        train.main(["train.py"])
    out = capsys.readouterr().out
    assert (model_dir / "metrics.json").read_text() == first
    assert json.loads(first)["steps"] == 20
    assert (
        f"training was already complete: global step 20 >= --max_steps=20 in "
        f"--model_dir={model_dir}"
    ) in out
    assert f"eval_auc={json.loads(first)['eval_auc']:.4f}" in out


@pytest.mark.parametrize("frontend", ["keras", "estimator"])
def test_tiered_tables_train_save_and_resume(tmp_path, frontend, capsys):
    model_dir, ssd = tmp_path / "run", tmp_path / "ssd"
    tier = dict(memory_rows=300, ssd_path=[str(ssd)], frontend=frontend, model_dir=str(model_dir))
    with flagsaver.flagsaver(**{**TINY, "max_steps": 20}, **tier):
        train.main(["train.py"])
    with flagsaver.flagsaver(**TINY, **tier):
        train.main(["train.py"])
    m = _metrics(model_dir)
    assert m["start_step"] == 20 and m["global_step"] == 30
    assert m["table_sizes"]["categorical"] > 1000  # both tiers; far more than memory_rows
    assert ssd.is_dir()
    # The summary's tier counters, from either front end (the run after the resume).
    stats = m["tier"]["categorical"]
    assert stats["promotions"] > 0 and stats["demotions"] > 0 and 0 < stats["hit_rate"] < 1
    assert stats["cold_keys"] + stats["memory_keys"] == m["table_sizes"]["categorical"]
    assert 0 < stats["memory_keys"] < stats["cold_keys"]
    # inspect_checkpoint knows what the checkpoint records: memory_rows, and so the split.
    with flagsaver.flagsaver(model_dir=str(model_dir), json=True):
        info = inspect_checkpoint.run()
    table = info["tables"]["categorical"]
    assert table["memory_rows"] == 300
    assert table["disk_rows"] == table["rows"] - 300 == m["table_sizes"]["categorical"] - 300
    with flagsaver.flagsaver(model_dir=str(model_dir), json=False):
        inspect_checkpoint.run()
    assert "tiered: memory_rows=300; a restore keeps 300 rows in memory" in capsys.readouterr().out
