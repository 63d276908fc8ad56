"""Scripts at the edges the fault campaign found: requests that cannot be met, read-only dirs."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(name, *args, cwd, timeout=180):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(cwd),
    )


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
