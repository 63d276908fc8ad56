"""The README's examples and the commands of README.md and docs/scripts.md are what users
copy: they must run as written on a fresh clone, after the README's two commands."""

import concurrent.futures
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", os.path.join("docs", "scripts.md"))
SCALE = 100  # documented step counts run 100x smaller (300 -> 3)
DEFAULT_MAX_STEPS = 300


def _read(doc):
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def _examples():
    return re.findall(r"```python\n(.*?)```", _read("README.md"), flags=re.S)


def commands(doc: str) -> list[str]:
    """Every command of `doc`: lines of ```sh blocks, then inline `python3 run.py ...` spans
    that are not templates (NAME, [FLAGS])."""
    text = _read(doc)
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        found += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    for span in re.findall(r"`(python3? [^`]*)`", text):
        if span not in found and not re.search(r"\b[A-Z]{3,}\b|\[", span):
            found.append(span)
    return found


def test_readme_has_examples():
    assert _examples()


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_example_runs(index, capsys):
    exec(compile(_examples()[index], f"README example {index}", "exec"), {})
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_goes_through_run_py(doc):
    """A fresh clone has absl, TensorFlow and npu_rec only inside .venv, which run.py makes."""
    found = commands(doc)
    assert found
    assert [c for c in found if not c.startswith("python3 run.py ")] == []


def _small(argv: list[str], tmp: str) -> list[str]:
    """The command at a small scale: /tmp/ -> tmp, step counts / SCALE, one eval batch."""
    out = []
    for arg in argv:
        arg = arg.replace("/tmp/", f"{tmp}/")
        m = re.fullmatch(r"--(max_steps|restore_model_version|eval_steps)=(\d+)", arg)
        out.append(f"--{m[1]}={max(1, int(m[2]) // SCALE)}" if m else arg)
    if "--help" in out:
        return out
    if out[0] == "test":
        return out
    script = out[1] if out[0] == "script" else out[0]
    given = {a.split("=", 1)[0] for a in out}
    if script in ("train", "online_train") and "--max_steps" not in given:
        out.append(f"--max_steps={DEFAULT_MAX_STEPS // SCALE}")
    if script in ("train", "online_train", "evaluate") and "--eval_steps" not in given:
        out.append("--eval_steps=1")
    return out


_RUNNER = r"""
import importlib, json, sys, traceback
from absl import flags
from npu_rec.scripts import evaluate, export, inspect_checkpoint, online_train, train  # flags
for name, *args in json.loads(sys.argv[1]):
    module = importlib.import_module(name)
    flags.FLAGS.unparse_flags()
    error = None
    try:
        module.main(flags.FLAGS([module.__file__, *args]))
    except SystemExit as stop:
        error = None if stop.code in (0, None) else f"exit status {stop.code}"
    except Exception:
        error = traceback.format_exc()[-3000:]
    print("RESULT " + json.dumps([name, *args, error]), flush=True)
"""


def _run_scripts(invocations, tmp_path):
    """Runs `npu_rec.scripts.NAME` invocations in order in one process (one TensorFlow import),
    as `app.run` would (flags parsed from the command line, then `main`)."""
    env = dict(os.environ, PYTHONPATH=ROOT, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(invocations)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    results = [
        json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")
    ]
    assert len(results) == len(invocations), out.stderr[-3000:]
    return [(r[:-1], r[-1]) for r in results if r[-1]]


def _help(argv) -> subprocess.CompletedProcess:
    """`python argv...` (a `--help` command) for real: absl prints the flags and exits."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )


def _load_run_py():
    """run.py itself, with the venv it would make being this interpreter's."""
    spec = importlib.util.spec_from_file_location("run_py", os.path.join(ROOT, "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._ensure_env = lambda extras: None  # never pip install here (a fresh module)
    return module


def _is_script(argv) -> bool:
    """Whether run.py started a script: `python -m npu_rec.scripts.NAME ...`."""
    return argv[0] == "-m" and argv[1].startswith("npu_rec.scripts.")


@pytest.fixture
def run_py():
    return _load_run_py()


@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    """doc -> (run.py's `main` exit code per command, what run.py started, the futures of
    the `--help` processes and of the scripts' process).

    Each command goes through run.py's `main` (the venv step stubbed: this interpreter is
    the venv); what run.py would start is then run: each document's scripts in one
    process, in the documented order, `--help` for real. The processes of both documents
    run side by side (each mostly imports TensorFlow); each test waits for its own.
    """
    run_py = _load_run_py()
    planned = {}
    for doc in DOCS:
        tmp = str(tmp_path_factory.mktemp("doc"))
        started = []
        run_py._run = lambda argv, started=started: started.append(argv) or 0
        codes = [
            (command, run_py.main(_small(shlex.split(command, comments=True)[2:], tmp)))
            for command in commands(doc)
        ]
        planned[doc] = (tmp, codes, started)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = {}
        for doc, (tmp, codes, started) in planned.items():
            scripts = [a[1:] for a in started if _is_script(a) and "--help" not in a]
            runs[doc] = [codes, started, [], pool.submit(_run_scripts, scripts, tmp)]
        for doc, (_, _, started) in planned.items():
            helps = sorted({tuple(a) for a in started if "--help" in a})
            runs[doc][2] = [pool.submit(_help, argv) for argv in helps]
        yield runs


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_runs(doc, documented):
    """Every command of `doc` goes through run.py and what it starts succeeds (see
    `documented`). `run.py test` starts pytest: that is this suite."""
    codes, started, helps, scripts_run = documented[doc]
    for command, code in codes:
        assert code == 0, command
    assert len(started) == len(commands(doc))
    assert [a for a in started if a[:2] != ["-m", "pytest"] and not _is_script(a)] == []
    scripts = [a[1] for a in started if _is_script(a)]
    assert all(importlib.util.find_spec(name) for name in scripts), scripts
    for out in (help_run.result() for help_run in helps):
        assert out.returncode == 0 and "--max_steps" in out.stdout, out.stderr[-2000:]
    failed = scripts_run.result()
    assert failed == [], "\n\n".join(f"{' '.join(a)}:\n{e}" for a, e in failed)


@pytest.mark.parametrize("argv", [["script"], ["script", "trian"], ["script", "_flags"]])
def test_run_py_script_names_the_scripts_it_runs(run_py, argv, capsys):
    run_py._run = lambda args: pytest.fail(f"started {args}")
    assert run_py.main(argv) == 2
    out = capsys.readouterr().out
    assert (
        "usage: python3 run.py script NAME [FLAGS], NAME one of evaluate, export, "
        "inspect_checkpoint, online_train, produce_sample, train."
    ) in out
    if len(argv) > 1:
        assert f"Received: {argv[1]!r}" in out
