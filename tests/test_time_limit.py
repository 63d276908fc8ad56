"""Every test has a time limit, so a hang fails loudly with a stack instead of stalling CI."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_hanging_test_fails_with_a_stack_dump(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        textwrap.dedent(
            """
            import threading

            def test_waits_forever():
                threading.Event().wait()
            """
        )
    )
    # The project's own pytest settings, with the limit shortened for this check only.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            os.path.join(ROOT, "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-o",
            "timeout=3",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_hang.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Timeout" in output, output
    assert "test_waits_forever" in output, output  # the stack names the hanging test


def test_the_suite_sets_a_time_limit_per_test():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        options = tomllib.load(f)["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 600
    assert options["timeout_method"] == "thread"  # dumps every thread's stack
