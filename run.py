#!/usr/bin/env python3
"""The two commands of npu_rec: `python3 run.py train` and `python3 run.py test`.

Each creates `.venv/` beside this file and installs npu_rec into it (with the
`scripts` extra, and the `test` extra for `test` and `bench`) when it is missing or
`setup.cfg` (or this file) has changed since, then runs inside it:

  python3 run.py train [FLAGS]         # python -m npu_rec.scripts.train: a reference model
                                       #   on the default data
  python3 run.py test [ARGS]           # the whole test suite (pytest ARGS)
  python3 run.py script NAME [FLAGS]   # python -m npu_rec.scripts.NAME: train, evaluate, export,
                                       #   inspect_checkpoint, online_train, produce_sample
                                       #   (--help: the flags)
  python3 run.py bench NAME            # benchmarks/NAME.py
"""

from __future__ import annotations

import configparser
import hashlib
import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
PYTHON = os.path.join(VENV, "bin", "python")
SCRIPTS_EXTRAS = "scripts"  # setup.cfg's extras: the scripts' dependencies
TEST_EXTRAS = "scripts,test"  # the suite runs the scripts too


def _ensure_env(extras: str) -> None:
    digest = hashlib.sha256(extras.encode())
    for name in ("setup.cfg", "run.py"):  # what is installed, and how
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(f.read())
    want = digest.hexdigest()
    stamp = os.path.join(VENV, f".npu_rec-installed-{extras.replace(',', '-') or 'base'}")
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    if not os.path.exists(PYTHON):
        print(f"Creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    target = f".[{extras}]" if extras else "."
    print(f"Installing npu_rec{'[' + extras + ']' if extras else ''} into {VENV} ...", flush=True)
    subprocess.run(
        [PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", target],
        cwd=ROOT,
        check=True,
    )
    if "test" in extras.split(","):
        # tf_keras (for model_fns using tf.compat.v1.layers, see docs/estimator.md) declares
        # a dependency on the `tensorflow` package, which would install a second TensorFlow
        # over tensorflow-cpu: install it without dependencies, at the pin in setup.cfg.
        subprocess.run(
            [
                PYTHON,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                *_extra_requirements("legacy"),
            ],
            cwd=ROOT,
            check=True,
        )
    with open(stamp, "w") as f:
        f.write(want)


def _extra_requirements(name: str) -> list[str]:
    """The requirements of an extra of setup.cfg (where all pins live)."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    lines = parser["options.extras_require"][name].splitlines()
    return [line.strip() for line in lines if line.strip()]


def _run(argv: list[str]) -> int:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    return subprocess.run([PYTHON, *argv], cwd=ROOT, env=env).returncode


def _scripts() -> list[str]:
    """The scripts `run.py script NAME` runs: npu_rec/scripts/NAME.py, NAME not starting
    with `_`."""
    names = os.listdir(os.path.join(ROOT, "npu_rec", "scripts"))
    return sorted(n[:-3] for n in names if n.endswith(".py") and not n.startswith("_"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("train", "test", "bench", "script"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        _ensure_env(SCRIPTS_EXTRAS)
        return _run(["-m", "npu_rec.scripts.train", *rest])
    if command == "script":
        if not rest or rest[0] not in _scripts():
            got = f" Received: {rest[0]!r}." if rest else ""
            print(
                f"usage: python3 run.py script NAME [FLAGS], NAME one of "
                f"{', '.join(_scripts())}.{got}"
            )
            return 2
        _ensure_env(SCRIPTS_EXTRAS)
        return _run(["-m", f"npu_rec.scripts.{rest[0]}", *rest[1:]])
    if command == "bench":
        _ensure_env(TEST_EXTRAS)
        if not rest:
            print("usage: python3 run.py bench NAME [FLAGS]")
            return 2
        return _run([os.path.join("benchmarks", f"{rest[0]}.py"), *rest[1:]])
    _ensure_env(TEST_EXTRAS)
    code = _run(["-m", "pytest", *rest])
    if code == 5:
        print("pytest collected no tests: failing, since a suite that runs nothing checks nothing.")
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
