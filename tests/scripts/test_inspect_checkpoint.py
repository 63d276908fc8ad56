"""inspect_checkpoint.py on damaged directories: what it calls restorable, a restore takes."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from absl.testing import flagsaver

import npu_rec
from npu_rec.checkpoint import CheckpointCorruptedError, VersionLog
from npu_rec.keras.callbacks import SparseCheckpoint
from npu_rec.scripts import _checkpoints, inspect_checkpoint
from tests.keras.test_online_callbacks import small_model, stream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = [1, 2, 3, 4, 5, 6, 7]


def _but(*steps):
    return [s for s in STEPS if s not in steps]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Full saves at steps 1 and 4, deltas at the other steps to 7."""
    directory = tmp_path_factory.mktemp("versions") / "run"
    npu_rec.init(
        save_steps=4,
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=1000,
        save_delta_checkpoints_secs=1,
    )
    try:
        model = small_model()
        ckpt = SparseCheckpoint(str(directory), clock=lambda: float(model.global_step))
        model.fit(stream(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[ckpt])
    finally:
        npu_rec.shutdown()
    assert [(v.step, v.kind) for v in VersionLog(str(directory)).versions()] == [
        (step, "full" if step in (1, 4) else "delta") for step in STEPS
    ]
    return directory


def _table(step, kind="delta"):
    return f"tables/ckpt-{step:012d}.{kind}.nrc"


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_state(path):
    text = path.read_text()
    payload = json.loads(text)
    payload["payload"]["edited"] = True  # valid JSON, another content
    path.write_text(json.dumps(payload))


def _unreadable(path):
    if os.geteuid() == 0:  # root reads any mode: a directory in the file's place
        path.unlink()
        path.mkdir()
    else:
        path.chmod(0)


def _delete_record(directory, step):
    (version,) = [v for v in VersionLog(str(directory)).versions() if v.step == step]
    (directory / "commits" / f"version-{version.seq:012d}.json").unlink()


def _damaged(steps, words):
    """Every version whose chain (a restore checks every part of it) holds the file."""
    return {step: ("damaged", words) for step in steps}


# kind -> (damage(directory), {step: (status, words of the problem)}, restorable steps)
DAMAGE = {
    "truncate": (
        lambda d: (d / _table(7)).write_bytes((d / _table(7)).read_bytes()[:-50]),
        {7: ("damaged", [_table(7), "truncated"])},
        _but(7),
    ),
    "flip": (
        lambda d: _flip(d / "dense-000000000006.npz"),
        _damaged([6, 7], ["dense-000000000006.npz", "SHA-256"]),
        _but(6, 7),
    ),
    "delete_part": (
        lambda d: (d / "state-000000000005.json").unlink(),
        _damaged([5, 6, 7], ["state-000000000005.json", "missing"]),
        _but(5, 6, 7),
    ),
    "delete_newest_delta": (
        lambda d: (d / _table(7)).unlink(),
        {7: ("damaged", [_table(7), "missing"])},
        _but(7),
    ),
    "edit_state": (
        lambda d: _edit_state(d / "state-000000000006.json"),
        _damaged([6, 7], ["state-000000000006.json", "corrupted"]),
        _but(6, 7),
    ),
    "delete_commit_record": (
        lambda d: _delete_record(d, 6),
        {
            6: ("uncommitted", ["no commit record"]),
            7: ("damaged", ["step 7", "parent version", "missing"]),
        },
        _but(6, 7),
    ),
    "empty_file": (
        lambda d: (d / "dense-000000000007.npz").write_bytes(b""),
        {7: ("damaged", ["dense-000000000007.npz", "truncated: 0 bytes"])},
        _but(7),
    ),
    "unreadable": (
        lambda d: _unreadable(d / "dense-000000000005.npz"),
        _damaged([5, 6, 7], ["dense-000000000005.npz"]),
        _but(5, 6, 7),
    ),
}


def _damaged_copy(saved, tmp_path, kind):
    directory = tmp_path / kind
    shutil.copytree(saved, directory)
    DAMAGE[kind][0](directory)
    return directory


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_inspect_marks_each_version_as_a_restore_finds_it(saved, tmp_path, kind, capsys):
    directory = _damaged_copy(saved, tmp_path, kind)
    _, expected, restorable = DAMAGE[kind]
    with flagsaver.flagsaver(model_dir=str(directory), json=True):
        inspect_checkpoint.main(["inspect_checkpoint.py"])
    info = json.loads(capsys.readouterr().out)
    status = {v["step"]: v for v in info["versions"]}
    for step in STEPS:
        want, words = expected.get(step, ("restorable", []))
        assert status[step]["status"] == want, status[step]
        for word in words:
            assert word in status[step]["problem"], status[step]["problem"]
    assert info["restore_model_version"] == restorable
    # The same checks a restore makes: every listed version restores, no other one does.
    log = VersionLog(str(directory))
    for v in log.versions():
        if v.step in restorable:
            log.select(v.step)
        else:
            with pytest.raises(CheckpointCorruptedError):
                log.select(v.step)
    assert log.select()[0].step == restorable[-1]
    # The text form names the same.
    with flagsaver.flagsaver(model_dir=str(directory), json=False):
        inspect_checkpoint.main(["inspect_checkpoint.py"])
    text = capsys.readouterr().out
    assert f"restore_model_version: {restorable}" in text
    for step, (want, _) in expected.items():
        assert any(f"step {step:>8}" in ln and want in ln for ln in text.splitlines()), text


def test_versions_moved_to_retired_are_listed_as_retired(saved, tmp_path):
    directory = _damaged_copy(saved, tmp_path, "truncate")
    with npu_rec.checkpoint._training_dir.TrainingDir(str(directory)) as tdir:
        version, _ = tdir.log.select()  # the damaged 7 is skipped
        tdir.start_from(version)  # and moved aside
    info = _checkpoints.describe(str(directory))
    retired = [v for v in info["versions"] if v["status"] == "retired"]
    assert [v["step"] for v in retired] == [7] and retired[0]["where"].startswith("retired/")
    assert info["restore_model_version"] == _but(7)


def test_the_script_describes_a_damaged_directory_and_exits_0(saved, tmp_path):
    directory = _damaged_copy(saved, tmp_path, "truncate")
    (directory / _table(1, "full")).write_bytes(b"")  # the base of every chain, too
    out = subprocess.run(
        [sys.executable, "-m", "npu_rec.scripts.inspect_checkpoint"] + [f"--model_dir={directory}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "restore_model_version: [4, 5, 6]" in out.stdout  # 1-3 lost their base, 7 its file
    assert out.stdout.count("damaged") == 4 and _table(1, "full") in out.stdout
