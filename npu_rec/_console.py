"""The console commands of the scripts (`npu-rec-train`, ...) and the check of their extra.

`pip install 'npu-rec[scripts]'` installs the scripts' own dependencies (tqdm for the
progress bar, matplotlib for `--report`) beside the library's; each command runs
`python -m npu_rec.scripts.NAME` in this process:

    npu-rec-train --max_steps=100            # = python -m npu_rec.scripts.train --max_steps=100
    npu-rec-inspect-checkpoint --model_dir=/tmp/run

Without the extra, importing `npu_rec.scripts` raises `ScriptsExtraMissing` naming it, and
a command prints that message in one line (exit status 2).
"""

from __future__ import annotations

import importlib.util
import runpy
import sys

EXTRA = "scripts"
EXTRA_MODULES = ("tqdm", "matplotlib")  # setup.cfg's extra `scripts` installs them
SCRIPTS = ("train", "evaluate", "export", "inspect_checkpoint", "online_train", "produce_sample")


class ScriptsExtraMissing(ImportError):
    """The scripts' dependencies are not installed (`pip install 'npu-rec[scripts]'`)."""


def require_scripts_extra() -> None:
    """Raises `ScriptsExtraMissing` naming the extra and the missing modules, if any."""
    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ScriptsExtraMissing(
            f"npu_rec's scripts need the `{EXTRA}` extra, which installs "
            f"{', '.join(EXTRA_MODULES)}; missing: {', '.join(missing)}. "
            f"Install it with: pip install 'npu-rec[{EXTRA}]'"
        )


def run_script(name: str) -> None:
    """Runs `npu_rec.scripts.<name>` as `python -m` would (its `__main__` block)."""
    if name not in SCRIPTS:
        raise ValueError(f"`name` must be one of {', '.join(SCRIPTS)}. Received: name={name!r}")
    try:
        require_scripts_extra()
    except ScriptsExtraMissing as error:
        sys.stderr.write(f"npu_rec: error: {error}\n")
        sys.exit(2)
    runpy.run_module(f"npu_rec.scripts.{name}", run_name="__main__", alter_sys=True)


def train() -> None:
    """`npu-rec-train`: `python -m npu_rec.scripts.train`."""
    run_script("train")


def evaluate() -> None:
    """`npu-rec-evaluate`: `python -m npu_rec.scripts.evaluate`."""
    run_script("evaluate")


def export() -> None:
    """`npu-rec-export`: `python -m npu_rec.scripts.export`."""
    run_script("export")


def inspect_checkpoint() -> None:
    """`npu-rec-inspect-checkpoint`: `python -m npu_rec.scripts.inspect_checkpoint`."""
    run_script("inspect_checkpoint")


def online_train() -> None:
    """`npu-rec-online-train`: `python -m npu_rec.scripts.online_train`."""
    run_script("online_train")


def produce_sample() -> None:
    """`npu-rec-produce-sample`: `python -m npu_rec.scripts.produce_sample`."""
    run_script("produce_sample")
