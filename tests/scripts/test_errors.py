"""What a user sees when a script fails: one line `npu_rec: error: <message>`, exit status 1.

Run as a user runs them (subprocesses). `--help` and flag errors come before
TensorFlow loads; the traceback is shown only when asked for.
"""

import concurrent.futures
import os
import subprocess
import sys
import time

import pytest
from absl.testing import flagsaver

from npu_rec.scripts import train
from tests.helpers import hold_training_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("train", "evaluate", "export", "inspect_checkpoint", "online_train")
#: Runs a script as `python -m npu_rec.scripts.NAME ARGS`, then says whether TensorFlow was
#: imported.
_WRAPPER = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('TF_IMPORTED=%s' % ('tensorflow' in sys.modules), "
    "file=sys.stderr))\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def _run(args, env=None, timeout=300):
    base = {k: v for k, v in os.environ.items() if k != "NPU_REC_TRACEBACK"}
    env = dict(base, PYTHONPATH=ROOT, **(env or {}))
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    return out, time.monotonic() - start


def _script(name, *args, env=None):
    """(completed process, seconds, TensorFlow imported?) of `npu_rec.scripts.<name> args`."""
    out, seconds = _run(["-c", _WRAPPER, f"npu_rec.scripts.{name}", *args], env)
    tf_line = [x for x in out.stderr.splitlines() if x.startswith("TF_IMPORTED=")]
    out.stderr = "\n".join(x for x in out.stderr.splitlines() if not x.startswith("TF_IMPORTED="))
    return out, seconds, tf_line == ["TF_IMPORTED=True"]


def _one_error_line(out, *fragments):
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 1, out.stderr[-3000:]
    assert lines and lines[-1].startswith("npu_rec: error: "), out.stderr[-3000:]
    assert all(f in lines[-1] for f in fragments), lines[-1]
    return lines


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_is_immediate_and_loads_no_tensorflow(name):
    out, seconds, tf_imported = _script(name, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "flags of this script" in out.stdout or "model:" in out.stdout
    assert "NPU_REC_TRACEBACK" in out.stdout  # how to see a traceback
    assert not tf_imported and out.stderr == "", out.stderr
    assert seconds < 2.0, seconds


def test_launch_help_is_immediate_and_loads_no_tensorflow():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['npu_rec.launch', '--help']\n"
        "try:\n    runpy.run_module('npu_rec.launch', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as stop:\n    assert stop.code == 0\n"
        "print('TF_IMPORTED=%s' % ('tensorflow' in sys.modules))\n"
    )
    out, seconds = _run(["-c", code])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--ps" in out.stdout and "TF_IMPORTED=False" in out.stdout
    assert out.stderr == ""
    assert seconds < 2.0, seconds


@pytest.mark.parametrize(
    "name, args, fragments",
    [
        ("train", [f"--max_steps={2**70}"], ["--max_steps", "range [1, 9223372036854775807]"]),
        ("train", ["--learning_rate=nan"], ["--learning_rate must be a finite number > 0"]),
        ("train", ["--sparse_learning_rate=inf"], ["--sparse_learning_rate must be a finite"]),
        ("train", ["--batch_size=50000000"], ["--batch_size", "range [1, 1048576]"]),
        ("train", ["--data={tmp}"], ["--data='{tmp}' is a directory", "glob pattern"]),
        ("evaluate", ["--eval_data={tmp}"], ["--eval_data='{tmp}' is a directory"]),
        ("train", ["--data=/nonexistent.csv"], ["'/nonexistent.csv' matches no file"]),
        (
            "export",
            ["--model_dir={tmp}", "--export_dir={tmp}/a_file/serving"],
            ["--export_dir", "'{tmp}/a_file' is a file, not a directory"],
        ),
        ("inspect_checkpoint", ["--model_dir={tmp}/none"], ["must be an existing directory"]),
        ("train", ["--memory_rows=100"], ["--memory_rows and --ssd_path come together"]),
        (
            "train",
            ["--memory_rows=0", "--ssd_path={tmp}"],
            ["--memory_rows=0", "not a positive integer"],
        ),
        (
            "train",
            ["--memory_rows=9", "--ssd_path=/dev/null"],
            ["--ssd_path must name directories"],
        ),
    ],
)
def test_flags_that_cannot_work_fail_in_one_line_before_tensorflow(name, args, fragments, tmp_path):
    (tmp_path / "a_file").write_text("keep me")
    args = [a.format(tmp=tmp_path) for a in args]
    out, _, tf_imported = _script(name, *args)
    lines = _one_error_line(out, *[f.format(tmp=tmp_path) for f in fragments])
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert not tf_imported
    assert (tmp_path / "a_file").read_text() == "keep me"


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """A trained run, then the failing commands a user meets with it, run side by side."""
    run = tmp_path_factory.mktemp("errors") / "run"
    tiny = dict(batch_size=64, max_steps=4, save_steps=2, eval_steps=1, verbose=0)
    with flagsaver.flagsaver(**tiny, model_dir=str(run)):
        train.main(["train.py"])
    corrupt = run.parent / "corrupt"
    subprocess.run(["cp", "-r", str(run), str(corrupt)], check=True)
    part = corrupt / "tables" / "ckpt-000000000004.full.nrc"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    evaluate = ["evaluate", f"--model_dir={corrupt}", "--restore_model_version=4"]
    holder = hold_training_lock(run)
    try:
        commands = {
            "locked": (["train", f"--model_dir={run}", "--max_steps=6", "--verbose=0"], None),
            "corrupt": (evaluate, None),
        }
        with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
            futures = {k: pool.submit(_script, *a, env=e) for k, (a, e) in commands.items()}
            return {k: f.result()[0] for k, f in futures.items()}, run, corrupt
    finally:
        holder.kill()
        holder.wait()


def test_a_locked_model_dir_is_one_line(failures):
    results, run, _ = failures
    out = results["locked"]
    _one_error_line(out, f"'{run}' is being trained by another process", "npu_rec.lock")
    assert "Traceback" not in out.stderr


def test_a_corrupt_checkpoint_is_one_line(failures):
    results, _, corrupt = failures
    part = f"'{corrupt}/tables/ckpt-000000000004.full.nrc' is corrupted"
    _one_error_line(results["corrupt"], part)
    assert "Traceback" not in results["corrupt"].stderr


@pytest.mark.parametrize("ask", [["--verbosity=1"], {"NPU_REC_TRACEBACK": "1"}])
def test_the_traceback_is_shown_on_request(ask, tmp_path):
    args = [f"--model_dir={tmp_path}/none", *(ask if isinstance(ask, list) else [])]
    out, _, _ = _script("inspect_checkpoint", *args, env=ask if isinstance(ask, dict) else None)
    _one_error_line(out, "--model_dir must be an existing directory")  # still the last line
    assert "Traceback (most recent call last)" in out.stderr
