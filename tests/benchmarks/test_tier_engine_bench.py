"""benchmarks/tier_engine_bench.py in short mode, and the segment engine it drives."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "tier_engine_bench.py")


@pytest.fixture(scope="module")
def bench():
    """The script as a module (its flags defined once per process)."""
    name = "tier_engine_bench"
    if name not in sys.modules:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_short_run_reports_every_engine_that_imports_and_skips_the_others(tmp_path):
    out = tmp_path / "engines.json"
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--keys=4000",
            "--record_bytes=88,176",
            "--reps=1",
            "--steps=2",
            "--warmup=1",
            "--cold_steps=1",
            "--promotions=300",
            f"--data_dir={tmp_path}",
            f"--json={out}",
        ],
        check=True,
        timeout=240,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"4000x88", "4000x176"}
    for key, entry in results.items():
        engines = [r["engine"] for r in entry["median"]]
        assert "segments" in engines, key  # npu_rec's own store runs wherever npu_rec does
        for name in ("lmdb", "rocksdb", "rocksdb_fbgemm", "leveldb"):
            assert name in engines or f"{name}: skipped" in done.stdout, (name, done.stdout)
        for row in entry["median"]:
            assert row["step_ms"] > 0 and row["read_records_per_s"] > 0, row
            # every record of the store is on disk, at least its own bytes
            assert row["disk_bytes_per_key_loaded"] >= entry["record_bytes"], row
            assert row["load_average_1min"][0] >= 0
        seg = next(r for r in entry["median"] if r["engine"] == "segments")
        assert 16 <= seg["index_bytes_per_key"] <= 40, seg  # 16 B buckets below 80% load
    assert os.listdir(tmp_path) == ["engines.json"]  # the data directories removed


@pytest.mark.parametrize("record_bytes", [88, 176])
def test_segment_engine_reads_back_the_records_written(bench, tmp_path, record_bytes):
    rng = np.random.default_rng(record_bytes)
    dtype = bench._record_dtype(record_bytes)
    keys = rng.choice(2**62, 3000, replace=False).astype(np.int64)
    recs = bench._records(dtype, keys, rng)
    db = bench.Segments(str(tmp_path), dtype, len(keys))
    try:
        db.write(keys, db.prepare(keys, recs))
        at = rng.permutation(len(keys))[:700]
        ask = keys[at]
        got = db.read(ask)
        want = recs[at]
        for field in ("key", "count", "saved", "last_seen", "row", "slots"):
            np.testing.assert_array_equal(got[field], want[field], err_msg=field)
        # a step: the read keys leave, as many new ones come
        db.delete(ask)
        fresh = np.arange(2**62, 2**62 + 700, dtype=np.int64)
        fresh_recs = bench._records(dtype, fresh, rng)
        db.write(fresh, db.prepare(fresh, fresh_recs))
        np.testing.assert_array_equal(db.read(fresh[::-1])["row"], fresh_recs["row"][::-1])
        with pytest.raises(KeyError):
            db.read(ask[:1])
    finally:
        db.close()


def test_hash_index_agrees_with_a_dict(bench):
    rng = np.random.default_rng(5)
    index = bench.HashIndex(5000)
    ref = {}
    next_key = 0
    for _ in range(30):
        new = np.arange(next_key, next_key + int(rng.integers(1, 400)), dtype=np.int64) * 7919
        next_key += len(new)
        vals = rng.integers(0, 2**40, len(new))
        index.insert(new, vals)
        ref.update(zip(new.tolist(), vals.tolist(), strict=True))
        if len(ref) > 50:
            gone = rng.choice(np.array(list(ref), np.int64), 40, replace=False)
            np.testing.assert_array_equal(index.pop(gone), [ref.pop(int(k)) for k in gone])
        keys = np.array(list(ref), np.int64)
        np.testing.assert_array_equal(index.get(keys), [ref[int(k)] for k in keys])
    assert index.nbytes / len(ref) >= 16
