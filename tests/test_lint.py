import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff():
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (it comes with the `test` extra)")
    return ruff


def test_ruff_finds_no_problems():
    result = subprocess.run([_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tree_is_formatted():
    """`ruff format` (pinned in setup.cfg, configured in pyproject.toml) leaves nothing to change."""
    result = subprocess.run(
        [_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr
