"""Eviction churn in every execution mode.

Long training with heavy eviction rebuilds the key index many times; after
every eviction and after every save + restore the whole table must equal the
NumPy reference (no evicted key answering, no live key lost or sharing a row,
no key twice, `size()` right).
"""

import numpy as np
import pytest

from tests.table.table_churn import MODES, ChurnDriver, check_table, reference

DIM = 4
KWARGS = {"access_threshold": 1, "eviction_threshold": 5, "dynamic_expansion": True}


@pytest.mark.parametrize("mode", MODES)
def test_zipf_stream_with_eviction_every_10_steps_matches_reference(mode, tmp_path):
    """200 steps, zipf ids, timestamp = step, evict every 10.

    Every fifth eviction is followed by a save + restore (a restore resets the index).
    """
    rng = np.random.default_rng(14)
    driver = ChurnDriver(mode, "churn", DIM, **KWARGS)
    ref = reference("churn", DIM, **KWARGS)
    rebuilds, evictions = 0, 0
    try:
        for step in range(1, 201):
            ids = np.unique(rng.zipf(1.3, 512) % 20000).astype(np.int64)
            grads = rng.normal(size=(len(ids), DIM)).astype(np.float32)
            got = driver.step(ids, step, grads)
            np.testing.assert_allclose(got, ref.lookup(ids.tolist(), [step] * len(ids)), atol=1e-5)
            ref.apply(ids.tolist(), grads)
            if step % 10:
                continue
            before = set(ref.rows)
            removed_before = driver.removed()
            freed = driver.evict(step)
            assert freed == ref.evict(step)
            evictions += 1
            rebuilds += freed > 0 and driver.removed() < removed_before + freed
            evicted = sorted(before - set(ref.rows))
            probe = evicted[:200] + sorted(ref.rows)[:200]
            check_table(driver, ref, probe)
            if step % 50:
                continue
            path = str(tmp_path / f"t{step}")
            driver.save(path)
            driver.restore(path)
            ref.end_period()
            check_table(driver, ref, probe)
    finally:
        driver.close()
    assert evictions == 20
    assert rebuilds >= 3, f"the key index was rebuilt {rebuilds} times; the test needs >= 3"
