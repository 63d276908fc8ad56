"""The scripts' command line: `--help` lists each script's flags, grouped, with defaults."""

import concurrent.futures
import os
import subprocess
import sys

import pytest
from absl import flags

from npu_rec.scripts import _flags as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _help(script):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-m", f"npu_rec.scripts.{script}", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def helps():
    """script -> what `scripts/<script>.py --help` printed: the processes run side by side
    (each mostly imports TensorFlow), once for the tests below."""
    scripts = ("train", "export", "inspect_checkpoint")
    with concurrent.futures.ThreadPoolExecutor(len(scripts)) as pool:
        return dict(zip(scripts, pool.map(_help, scripts), strict=True))


def test_train_help_lists_the_flags_by_topic_with_defaults(helps):
    text = helps["train"]
    assert text.startswith("Trains a reference model")
    for flag, default in [
        ("model", "deepfm"),
        ("data", "synthetic"),
        ("batch_size", "1024"),
        ("max_steps", "300"),
        ("model_dir", "-"),
        ("frontend", "keras"),
    ]:
        line = next(x for x in text.splitlines() if x.strip().startswith(f"--{flag}"))
        assert line.endswith(f"(default: {default})"), line
    for title, _ in F.GROUPS:
        assert f"\n{title}:\n" in text
    model = text.index("\nmodel:\n")
    assert model < text.index("--embedding_dim", model) < text.index("\ndata:\n")


@pytest.mark.parametrize(
    "script, own", [("export", "--export_dir"), ("inspect_checkpoint", "--[no]json")]
)
def test_tool_help_lists_its_own_flags_first(helps, script, own):
    text = helps[script]
    section = text.split("flags of this script:\n", 1)[1]
    assert section.lstrip().startswith(own)
    assert "--model_dir" in text


def test_every_shared_flag_is_in_exactly_one_help_group():
    grouped = [name for _, names in F.GROUPS for name in names]
    defined = {
        name
        for name, fl in flags.FLAGS._flags().items()
        if flags.FLAGS.find_module_defining_flag(name) == F.__name__ and name == fl.name
    }
    assert sorted(grouped) == sorted(defined)
