"""Committed versions of a checkpoint directory: chains, retention, clean-up, damaged records."""

import logging
import os

import pytest

from npu_rec.checkpoint import CheckpointCorruptedError, VersionLog
from npu_rec.checkpoint._training_dir import TrainingDir


def _save(tdir, step, kind):
    """Writes two dummy parts of a version and commits it."""
    parts = [f"dense-{step:012d}.npz", f"tables/ckpt-{step:012d}.{kind}.nrc"]
    for rel in parts:
        path = tdir.log.path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(f"{rel} {step}".encode())
    return tdir.commit(step, kind, parts)


@pytest.mark.parametrize(
    "keep, kept", [(1, [4, 5]), (2, [4, 5]), (3, [1, 2, 3, 4, 5]), (0, [1, 2, 3, 4, 5])]
)
def test_retention_deletes_whole_old_chains_only(tmp_path, keep, kept):
    with TrainingDir(str(tmp_path), keep=keep) as tdir:
        tdir.start_from(None)
        for step, kind in [(1, "full"), (2, "delta"), (3, "delta"), (4, "full"), (5, "delta")]:
            _save(tdir, step, kind)
    log = VersionLog(str(tmp_path))
    assert [v.step for v in log.versions()] == kept
    assert sorted(p.name for p in tmp_path.glob("dense-*")) == [f"dense-{s:012d}.npz" for s in kept]
    newest, chain = log.select()
    assert newest.step == 5 and [v.step for v in chain] == [4, 5]


def test_opening_for_training_removes_temporary_files_and_uncommitted_parts(tmp_path, caplog):
    with TrainingDir(str(tmp_path)) as tdir:
        tdir.start_from(None)
        _save(tdir, 1, "full")
    leftovers = [
        "dense-000000000002.npz",
        "state-000000000002.json",
        "model.ckpt-2.index",
        "tables/ckpt-000000000002.delta.nrc",
        "tables/ckpt-000000000002.full.nrc.tmp-7",
        "dense-000000000002.npz.tmp.npz",
        "model.ckpt-2.data-00000-of-00001.tempstate1",
        "checkpoint.tmp0a1b",
        "commits/version-000000000002.json.tmp-9",
    ]
    for rel in leftovers:
        (tmp_path / rel).write_text("partial")
    (tmp_path / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING), TrainingDir(str(tmp_path)):
        pass
    assert not [rel for rel in leftovers if (tmp_path / rel).exists()]
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "dense-000000000001.npz").exists()
    assert any("uncommitted" in r.getMessage() for r in caplog.records)


def test_an_altered_record_or_part_is_never_restored_silently(tmp_path, caplog):
    with TrainingDir(str(tmp_path)) as tdir:
        tdir.start_from(None)
        _save(tdir, 1, "full")
        _save(tdir, 2, "delta")
    record = tmp_path / "commits" / "version-000000000002.json"
    record.write_text(record.read_text().replace('"step": 2', '"step": 3'))
    with caplog.at_level(logging.WARNING):
        assert VersionLog(str(tmp_path)).select()[0].step == 1
    assert any("version-000000000002.json" in r.getMessage() for r in caplog.records)
    (tmp_path / "dense-000000000001.npz").write_text("x" * 24)  # same size, other bytes
    with pytest.raises(CheckpointCorruptedError, match="dense-000000000001.npz.*SHA-256"):
        VersionLog(str(tmp_path)).select(fallback=False)
