"""The console commands `npu-rec-NAME` and the `scripts` extra they need (setup.cfg)."""

import configparser
import importlib.util
import os
import subprocess
import sys

import pytest

from npu_rec import _console

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    return parser


def test_every_script_has_a_console_command_running_it():
    lines = _setup_cfg()["options.entry_points"]["console_scripts"].strip().splitlines()
    commands = dict(line.replace(" ", "").split("=") for line in lines)
    scripts = sorted(
        n[:-3]
        for n in os.listdir(os.path.join(ROOT, "npu_rec", "scripts"))
        if n.endswith(".py") and not n.startswith("_")
    )
    assert sorted(_console.SCRIPTS) == scripts
    assert commands == {f"npu-rec-{s.replace('_', '-')}": f"npu_rec._console:{s}" for s in scripts}
    for name in scripts:
        assert callable(getattr(_console, name))


def test_the_extra_installs_the_modules_the_check_asks_for():
    extra = _setup_cfg()["options.extras_require"][_console.EXTRA]
    installed = {line.split(">")[0].split("=")[0].strip() for line in extra.strip().splitlines()}
    assert installed == set(_console.EXTRA_MODULES)
    assert "tqdm" not in _setup_cfg()["options"]["install_requires"]


@pytest.fixture
def without_tqdm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        _console.importlib.util, "find_spec", lambda name: None if name == "tqdm" else real(name)
    )


def test_a_missing_extra_is_named_with_the_install_command(without_tqdm):
    with pytest.raises(
        ImportError,
        match=r"`scripts` extra.*missing: tqdm\..*"
        r"pip install 'npu-rec\[scripts\]'",
    ):
        _console.require_scripts_extra()


def test_a_console_command_without_the_extra_says_so_in_one_line(without_tqdm, capsys):
    with pytest.raises(SystemExit) as stop:
        _console.train()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("npu_rec: error: npu_rec's scripts need the `scripts` extra")
    assert err.count("\n") == 1


def test_with_the_extra_the_check_passes():
    _console.require_scripts_extra()  # this environment has it (run.py installs it)


def test_an_unknown_script_is_refused():
    with pytest.raises(ValueError, match=r"`name` must be one of train, .*Received: name='trian'"):
        _console.run_script("trian")


def test_npu_rec_train_help_lists_the_flags():
    """What the installed `npu-rec-train --help` runs (the entry point's function)."""
    code = "import sys; from npu_rec import _console; sys.argv = ['npu-rec-train', '--help']; _console.train()"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--max_steps" in out.stdout and "Trains a reference model" in out.stdout
