"""npu_rec logs through absl's logger and never configures Python's root logger.

A library that calls `absl.logging.info()` or `logging.info()` adds a root handler
(`logging.basicConfig()`) behind the user's back; TensorFlow's logger has a handler
of its own, so every TensorFlow warning then printed twice.
"""

import concurrent.futures
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(argv) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )


_LIBRARY = """
import logging
import numpy as np
import tensorflow as tf
import npu_rec
from npu_rec.checkpoint import _manager
from npu_rec.keras.callbacks import _sparse_checkpoint
npu_rec.init(max_steps=10, if_load=True, bind_cpu=False)       # logs at INFO
_sparse_checkpoint.logging.info("keras callback info")          # stdlib before
_manager.logging.info("checkpoint info")
npu_rec._cpu.logging.warning("npu_rec probe %d", 1)
tf.get_logger().warning("tensorflow probe")
print("root handlers:", logging.getLogger().handlers)
"""

_SCRIPT = '''
"""A script probing the log setup of npu_rec/scripts/_cli.py."""
import tensorflow as tf
from absl import app
from npu_rec import _log
from npu_rec.scripts import _cli

def main(argv):
    _cli.quiet_logs()
    _log.info("npu_rec info probe")
    _log.warning("npu_rec probe")
    tf.get_logger().warning("tensorflow probe")

_cli.run(main, __doc__)
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The library probe ("library") and the script probe ("script") processes, run side
    by side once (each mostly imports TensorFlow)."""
    script = tmp_path_factory.mktemp("probe") / "probe.py"
    script.write_text(_SCRIPT)
    argvs = {"library": ["-c", _LIBRARY], "script": [str(script)]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(argvs, pool.map(_run, argvs.values()), strict=True))


def test_library_use_prints_each_warning_once_and_leaves_the_root_logger_alone(runs):
    out = runs["library"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "root handlers: []" in out.stdout
    assert out.stderr.count("npu_rec probe 1") == 1, out.stderr
    assert out.stderr.count("tensorflow probe") == 1, out.stderr


def test_scripts_print_each_warning_once(runs):
    out = runs["script"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("npu_rec probe") == 1, out.stderr
    assert out.stderr.count("tensorflow probe") == 1, out.stderr
    assert "info probe" not in out.stderr
