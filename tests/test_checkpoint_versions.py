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


def test_temporary_files_of_tensorflows_writers_and_ours_are_removed_at_the_next_start(tmp_path):
    with TrainingDir(str(tmp_path)) as tdir:
        tdir.start_from(None)
        _save(tdir, 1, "full")
    dead = 2**22 + 17  # above any pid this machine hands out
    leftovers = [
        "graph.pbtxt.tmp" + "0123456789abcdef" * 2,  # tf.io.write_graph on a full disk
        "checkpoint.tmp" + "f" * 32,
        f"metrics.json.tmp-{dead}",
        f"run_flags.json.tmp-{dead}",
    ]
    for rel in leftovers:
        (tmp_path / rel).write_text("partial")
    live = tmp_path / f"eval_metrics.json.tmp-{os.getppid()}"  # a reader still writing it
    live.write_text("partial")
    with TrainingDir(str(tmp_path)):
        pass
    assert sorted(p.name for p in tmp_path.iterdir() if p.name in leftovers) == []
    assert live.exists() and (tmp_path / "dense-000000000001.npz").exists()


def test_a_version_whose_commit_record_was_deleted_is_moved_to_retired_not_deleted(tmp_path):
    import numpy as np

    from npu_rec._paths import write_json_atomic
    from npu_rec.checkpoint._versions import sealed

    def save(tdir, step):
        parts = [f"dense-{step:012d}.npz", f"state-{step:012d}.json"]
        np.savez(tdir.log.path(parts[0]), w0=np.full(3, step, np.float32))
        write_json_atomic(tdir.log.path(parts[1]), sealed({"step": step}))
        return tdir.commit(step, "full", parts)

    with TrainingDir(str(tmp_path)) as tdir:
        tdir.start_from(None)
        save(tdir, 1)
        two = save(tdir, 2)
        save(tdir, 3)
    os.remove(tmp_path / "commits" / f"version-{two.seq:012d}.json")
    (tmp_path / "dense-000000000004.npz").write_bytes(b"PK partial")  # an interrupted save
    with TrainingDir(str(tmp_path)):
        pass
    assert [v.step for v in VersionLog(str(tmp_path)).versions()] == [1, 3]
    retired = sorted(p.name for p in (tmp_path / "retired").rglob("*-000000000002.*"))
    assert retired == ["dense-000000000002.npz", "state-000000000002.json"]
    assert not (tmp_path / "dense-000000000002.npz").exists()
    assert not (tmp_path / "dense-000000000004.npz").exists()
    assert not list((tmp_path / "retired").rglob("dense-000000000004.npz"))
