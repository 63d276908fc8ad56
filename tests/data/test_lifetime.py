"""Sources dropped or restored mid-read: garbage collection never hangs, `close()` frees threads."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

from tests.data.conftest import make_source, rids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each round leaves a source suspended in the middle of a file (its reader generator and the
# source refer to each other, so only the cycle collector frees them) or restores it, which
# drops the reader mid-read. Garbage collections are made frequent, with thresholds that vary,
# so that one sooner or later runs inside a thread's start-up, which once hung a CI run.
_ABANDON = textwrap.dedent(
    """
    import faulthandler, gc, pathlib, sys
    from tests.data.conftest import make_source, open_source
    faulthandler.dump_traceback_later({limit}, exit=True)
    tmp = pathlib.Path(sys.argv[1])
    for kind, rounds in [("csv", 1000), ("parquet", 40), ("tfrecord", 15)]:
        (tmp / kind).mkdir()
        make_source(kind, tmp / kind)
        options = {{"block_bytes": 64}} if kind == "csv" else {{}}
        for i in range(rounds):
            gc.set_threshold(20 + (i * 37) % 400, 1, 1)
            source = open_source(kind, tmp / kind, **options)
            source.next_minibatch(3)
            if i % 3 == 0:
                state = source.get_checkpoint_state()
                source.next_minibatch(2)
                source.restore_from_checkpoint(state)
                source.next_minibatch(2)
            del source
        gc.set_threshold(700, 10, 10)
        gc.collect()
        print("done", kind, rounds, flush=True)
    """
)


def test_sources_abandoned_mid_read_are_collected_without_a_hang(tmp_path):
    limit = 150  # seconds: about 30 on a loaded 2-core machine; the old code hung
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, "-c", _ABANDON.format(limit=limit), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=limit + 30,
        cwd=ROOT,
        env=env,
    )
    output = result.stdout + result.stderr[-6000:]
    assert result.returncode == 0 and "done tfrecord" in result.stdout, output


def _threads():
    """CsvSource's parsing threads (other tests' tf.data threads come and go meanwhile)."""
    return {t for t in threading.enumerate() if t.name.startswith("npu_rec-CsvSource")}


def _wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return condition()


def test_close_stops_the_reading_thread_and_reading_again_reopens(tmp_path):
    before = _threads()
    source = make_source("csv", tmp_path, block_bytes=64)
    first = rids(source.next_minibatch(5))
    assert _threads() - before  # a parsing thread reads ahead
    source.close()
    assert not (_threads() - before)  # joined by close(), not by a finaliser
    # The position is kept: reading again reopens the file where it stopped.
    assert first + rids(source.next_minibatch(5)) == list(range(10))
    with source:
        source.next_minibatch(5)
    assert not (_threads() - before)


def test_an_abandoned_source_leaves_no_thread_behind(tmp_path):
    before = _threads()
    for _ in range(5):
        source = make_source("csv", tmp_path, block_bytes=64)
        source.next_minibatch(5)
    del source
    gc.collect()
    assert _wait_until(lambda: not (_threads() - before)), _threads() - before
