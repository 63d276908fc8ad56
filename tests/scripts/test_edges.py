"""Scripts at the edges the fault campaign found: requests that cannot be met, read-only dirs."""

import json
import os
import resource
import subprocess
import sys

import pytest

from npu_rec.checkpoint._versions import TEMPORARY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(name, *args, cwd, timeout=180, file_size_limit=None):
    """Runs `python -m npu_rec.scripts.NAME`; `file_size_limit` (bytes) makes its disk "full" (EFBIG)."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")

    def limit():
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, "-m", f"npu_rec.scripts.{name}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(cwd),
        preexec_fn=limit,
    )


def _temporary_files(model_dir):
    return [
        os.path.join(folder, name)
        for folder, dirs, files in os.walk(model_dir)
        for name in files + dirs
        if TEMPORARY.match(name)
    ]


@pytest.mark.parametrize(("frontend", "version"), [("keras", 5), ("estimator", 100)])
def test_restore_model_version_on_an_empty_model_dir_fails_naming_version_and_dir(
    tmp_path, frontend, version
):
    model_dir = tmp_path / "empty"
    model_dir.mkdir()
    out = _script(
        "train",
        f"--frontend={frontend}",
        f"--model_dir={model_dir}",
        "--max_steps=60",
        f"--restore_model_version={version}",
        cwd=tmp_path,
    )
    assert out.returncode != 0, out.stdout
    assert f"--restore_model_version={version}" in out.stderr, out.stderr
    assert str(model_dir) in out.stderr, out.stderr
    assert "already complete" not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert not (model_dir / "metrics.json").exists()
    assert not any(n.startswith(("dense-", "model.ckpt-")) for n in os.listdir(model_dir))


def test_no_temporary_file_survives_a_full_disk_run_and_a_resume(tmp_path):
    model_dir = tmp_path / "run"
    flags = [
        "--frontend=estimator",
        f"--model_dir={model_dir}",
        "--max_steps=8",
        "--save_steps=4",
        "--batch_size=32",
        "--eval_steps=1",
        "--embedding_dim=4",
        "--verbose=0",
    ]
    full = _script("train", *flags, cwd=tmp_path, file_size_limit=40_000)
    assert full.returncode != 0  # the graph (TensorFlow's atomic writer) did not fit
    resumed = _script("train", *flags, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _temporary_files(model_dir) == []
    assert json.loads((model_dir / "metrics.json").read_text())["global_step"] == 8


@pytest.fixture
def read_only(tmp_path):
    """Makes a directory read-only for root too (a read-only bind mount), where permitted."""
    mounted = []

    def make(path):
        done = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
        if done.returncode != 0:
            if os.geteuid() == 0:
                pytest.skip("a read-only directory needs a bind mount here (not permitted)")
            path.chmod(0o555)
            return
        mounted.append(path)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)

    yield make
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def test_evaluate_on_a_read_only_model_dir_prints_the_metrics_and_warns(tmp_path, read_only):
    model_dir = tmp_path / "run"
    flags = [f"--model_dir={model_dir}", "--batch_size=32", "--eval_steps=1", "--embedding_dim=4"]
    trained = _script(
        "train", *flags, "--max_steps=4", "--save_steps=4", "--verbose=0", cwd=tmp_path
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    read_only(model_dir)
    out = _script("evaluate", *flags, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "eval_loss=" in out.stdout and "eval_auc=" in out.stdout
    assert "eval_metrics.json" in out.stderr and "Traceback" not in out.stderr
    assert not (model_dir / "eval_metrics.json").exists()
