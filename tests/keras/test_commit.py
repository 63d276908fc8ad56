"""SparseCheckpoint versions are committed: damage, failed saves, locks, rollbacks, keep."""

import logging

import numpy as np
import pytest

import npu_rec
from npu_rec.checkpoint import CheckpointCorruptedError, CheckpointDirLockedError
from npu_rec.keras.callbacks import SparseCheckpoint
from tests.helpers import hold_training_lock
from tests.keras.builders import table_state
from tests.keras.test_data_position import BATCH, model_and_dataset, uninterrupted, write_csv
from tests.keras.test_online_callbacks import small_model, stream


def _fit(directory, steps, *, model=None, **kwargs):
    model = model or small_model()
    ckpt = SparseCheckpoint(str(directory), save_freq=kwargs.pop("save_freq", 2), **kwargs)
    model.fit(stream(), epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[ckpt])
    return model, ckpt


def _resume(directory, checkpoint_fallback=True, **kwargs):
    npu_rec.shutdown()
    npu_rec.table._registry.clear()
    npu_rec.init(if_load=True, **kwargs)
    model = small_model()
    return model, SparseCheckpoint(str(directory), checkpoint_fallback=checkpoint_fallback)


@pytest.fixture
def trained(tmp_path):
    npu_rec.init(save_steps=2)
    _fit(tmp_path, 4)  # versions 2 and 4
    return tmp_path


def test_a_truncated_dense_file_falls_back_with_a_warning_naming_it(trained, caplog):
    dense = trained / "dense-000000000004.npz"
    dense.write_bytes(dense.read_bytes()[:-100])
    npu_rec.shutdown()
    model = small_model()
    with pytest.raises(CheckpointCorruptedError, match="dense-000000000004.npz"):
        SparseCheckpoint(str(trained), restore=True, checkpoint_fallback=False).prepare(model)
    with caplog.at_level(logging.WARNING):
        assert SparseCheckpoint(str(trained), restore=True).prepare(model) == 2
    assert any(
        "dense-000000000004.npz" in r.getMessage() and "skipping" in r.getMessage()
        for r in caplog.records
    )


def test_a_deleted_data_position_is_not_a_silent_restart_at_row_0(tmp_path, caplog):
    csv, directory = write_csv(tmp_path / "data.csv"), tmp_path / "ckpt"
    npu_rec.init()
    model, src, ds = model_and_dataset(csv, [])
    ckpt = SparseCheckpoint(
        str(directory), save_freq=3, data_source=src, reading_position=ds.reading_position
    )
    model.fit(ds, epochs=1, steps_per_epoch=6, verbose=0, callbacks=[ckpt])
    (directory / "state-000000000006.json").unlink()
    npu_rec.shutdown()
    npu_rec.init(if_load=True)
    seen = []
    model, src, ds = model_and_dataset(csv, seen)
    ckpt = SparseCheckpoint(str(directory), data_source=src, reading_position=ds.reading_position)
    with caplog.at_level(logging.WARNING):
        model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[ckpt])
    assert ckpt.restored_step == 3  # the newest complete version
    assert seen == uninterrupted(csv, 5)[3 * BATCH :]  # continues at batch 4, not row 0
    assert any(
        "state-000000000006.json" in r.getMessage() and "missing" in r.getMessage()
        for r in caplog.records
    )


def test_an_edited_data_position_is_refused_naming_the_file(trained):
    state = trained / "state-000000000004.json"
    text = state.read_text()
    state.write_text(text.replace('"step": 4', '"step": 5'))
    model, ckpt = _resume(trained, checkpoint_fallback=False)
    with pytest.raises(CheckpointCorruptedError, match="state-000000000004.json"):
        ckpt.prepare(model)


def test_a_rollback_never_restores_or_extends_the_abandoned_branch(tmp_path):
    npu_rec.init(
        save_steps=4,
        is_incremental_checkpoint=True,
        save_checkpoint_due_time=1000,
        save_delta_checkpoints_secs=1,
    )
    model = small_model()
    ckpt = SparseCheckpoint(str(tmp_path), clock=lambda: float(model.global_step))
    model.fit(stream(), epochs=1, steps_per_epoch=7, verbose=0, callbacks=[ckpt])
    assert ckpt.saves[-3:] == [(5, "delta"), (6, "delta"), (7, "delta")]
    # Roll back to 5 and train a different branch to 6.
    model, _ = _resume(tmp_path, restore_model_version=5, save_steps=4)
    ckpt = SparseCheckpoint(str(tmp_path), clock=lambda: float(model.global_step))
    model.fit(stream(seed=9), epochs=1, steps_per_epoch=1, verbose=0, callbacks=[ckpt])
    assert ckpt.restored_step == 5 and model.global_step == 6
    branch = table_state(model.tables[0])
    # Resuming takes the newest save (6 of the new branch), not the abandoned 7.
    model, ckpt = _resume(tmp_path)
    assert ckpt.prepare(model) == 6
    restored = table_state(model.tables[0])
    assert restored.keys() == branch.keys()
    for key, row in branch.items():
        np.testing.assert_array_equal(restored[key], row)
    assert sorted(p.name for p in (tmp_path / "retired").rglob("*.npz")) == [
        "dense-000000000006.npz",
        "dense-000000000007.npz",
    ]


def test_a_second_trainer_fails_at_once_naming_the_holder(tmp_path):
    holder = hold_training_lock(tmp_path)
    try:
        npu_rec.init(save_steps=2)
        with pytest.raises(CheckpointDirLockedError, match=f"pid {holder.pid} on host"):
            _fit(tmp_path, 4)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not list(tmp_path.glob("dense-*"))
    npu_rec.table._registry.clear()
    _, ckpt = _fit(tmp_path, 2)  # the lock is free again once its holder is gone
    assert ckpt.saves == [(2, "full")]


def test_keep_checkpoint_max_counts_every_save_across_fit_calls(tmp_path):
    npu_rec.init(save_steps=2)
    model = small_model()
    for _ in range(3):
        _fit(tmp_path, 4, model=model, keep_checkpoint_max=2)
    assert sorted(p.name for p in tmp_path.glob("dense-*")) == [
        "dense-000000000010.npz",
        "dense-000000000012.npz",
    ]
    assert sorted(p.name for p in tmp_path.glob("state-*")) == [
        "state-000000000010.json",
        "state-000000000012.json",
    ]
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "ckpt-000000000010.full.nrc",
        "ckpt-000000000012.full.nrc",
    ]


def test_a_failed_table_write_publishes_nothing(trained, monkeypatch):
    from npu_rec.table._sparse import SingleShardTable

    before = sorted(str(p.relative_to(trained)) for p in trained.rglob("*") if p.is_file())

    def broken(self, *args, **kwargs):
        raise ValueError(f"TableInvariantError: table {self.name!r}: duplicate keys")

    model, ckpt = _resume(trained, save_steps=2)
    monkeypatch.setattr(SingleShardTable, "read_state", broken)
    with pytest.raises(ValueError, match="TableInvariantError"):
        model.fit(stream(), epochs=1, steps_per_epoch=2, verbose=0, callbacks=[ckpt])
    after = sorted(str(p.relative_to(trained)) for p in trained.rglob("*") if p.is_file())
    assert after == before
    monkeypatch.undo()
    model, ckpt = _resume(trained, save_steps=2)
    assert ckpt.prepare(model) == 4


def test_a_directory_written_before_commit_records_still_restores(trained):
    import json
    import shutil

    shutil.rmtree(trained / "commits")
    for path in trained.glob("state-*.json"):
        path.write_text(json.dumps(json.loads(path.read_text())["payload"]))
    model, ckpt = _resume(trained, save_steps=2)
    model.fit(stream(), epochs=1, steps_per_epoch=2, verbose=0, callbacks=[ckpt])
    assert ckpt.restored_step == 4 and model.global_step == 6
    assert sorted(int(p.name[6:18]) for p in trained.glob("dense-*")) == [2, 4, 6]
    model, ckpt = _resume(trained)
    assert ckpt.prepare(model) == 6


def test_restore_model_version_on_an_empty_directory_names_the_version_and_directory(tmp_path):
    npu_rec.init(if_load=True, restore_model_version=5)
    model = small_model()
    ckpt = SparseCheckpoint(str(tmp_path / "empty"))
    with pytest.raises(npu_rec.ConfigError, match=r"restore_model_version=5.*empty"):
        model.fit(stream(), epochs=1, steps_per_epoch=2, verbose=0, callbacks=[ckpt])
    assert int(model.global_step) == 0  # nothing was trained
