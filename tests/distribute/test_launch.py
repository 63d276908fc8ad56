"""`npu_rec.launch`: TF_CONFIG per task, prefixed logs, failure and time-limit handling."""

import io
import json
import subprocess
import sys
import textwrap
import time

import pytest

from npu_rec import launch


def _script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "task.py"
    path.write_text(
        textwrap.dedent("""\
        import json, os, sys, time
        cfg = json.loads(os.environ["TF_CONFIG"])
        job, index = cfg["task"]["type"], cfg["task"]["index"]
        """)
        + textwrap.dedent(body)
    )
    return [sys.executable, str(path)]


def _lines(out: io.BytesIO) -> list[str]:
    return out.getvalue().decode().splitlines()


def test_each_task_gets_its_tf_config_and_prefixed_output(tmp_path):
    cmd = _script(
        tmp_path,
        """\
        print(json.dumps(cfg), flush=True)
        """,
    )
    out = io.BytesIO()
    assert launch.run(cmd, workers=2, ps=1, chief=True, out=out, timeout_secs=60) == 0
    configs = {}
    for line in _lines(out):
        prefix, _, body = line.partition("] ")
        configs[prefix[1:]] = json.loads(body)
    assert sorted(configs) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    cluster = configs["worker:0"]["cluster"]
    assert all(c["cluster"] == cluster for c in configs.values())
    addresses = [a for job in cluster.values() for a in job]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert configs["worker:1"]["task"] == {"type": "worker", "index": 1}


def test_ps_tasks_are_stopped_once_the_workers_finish(tmp_path):
    cmd = _script(
        tmp_path,
        """\
        if job == "ps":
            time.sleep(600)
        """,
    )
    start = time.monotonic()
    assert launch.run(cmd, workers=2, ps=1, out=io.BytesIO(), timeout_secs=60) == 0
    assert time.monotonic() - start < 30


def test_ps_without_chief_adds_the_chief_and_says_so(tmp_path):
    """A cluster with ps tasks has exactly one chief (tf.estimator's RunConfig rule)."""
    cmd = _script(tmp_path, "print(json.dumps(cfg['cluster']), flush=True)\n")
    out = io.BytesIO()
    assert launch.run(cmd, workers=1, ps=1, out=out, timeout_secs=60) == 0
    lines = _lines(out)
    assert lines[0] == "[launch] 1 ps task(s) need a chief task: adding chief:0 (as --chief does)"
    clusters = [json.loads(x.partition("] ")[2]) for x in lines[1:]]
    assert {x.partition("]")[0] for x in lines[1:]} == {"[chief:0", "[worker:0", "[ps:0"}
    assert all(sorted(c) == ["chief", "ps", "worker"] and len(c["chief"]) == 1 for c in clusters)


def test_a_failing_task_stops_the_others_and_gives_its_exit_code(tmp_path):
    marker = tmp_path / "survivor_finished"
    cmd = _script(
        tmp_path,
        f"""\
        if index == 1:
            sys.exit(7)
        time.sleep(60)
        open({str(marker)!r}, "w").close()
        """,
    )
    out = io.BytesIO()
    start = time.monotonic()
    assert launch.run(cmd, workers=3, out=out, timeout_secs=120) == 7
    assert time.monotonic() - start < 30
    assert not marker.exists()
    assert any("task worker:1 failed with exit code 7" in line for line in _lines(out))


def test_a_task_killed_by_a_signal_gives_128_plus_the_signal(tmp_path):
    cmd = _script(
        tmp_path,
        """\
        import signal
        if index == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """,
    )
    assert launch.run(cmd, workers=2, out=io.BytesIO(), timeout_secs=60) == 128 + 9


def test_grace_lets_the_others_report_before_they_are_stopped(tmp_path):
    cmd = _script(
        tmp_path,
        """\
        if index == 0:
            sys.exit(3)
        time.sleep(1)
        print("peer worker:0 lost", flush=True)
        sys.exit(5)
        """,
    )
    out = io.BytesIO()
    assert launch.run(cmd, workers=2, out=out, grace_secs=30, timeout_secs=60) == 3
    assert "[worker:1] peer worker:0 lost" in _lines(out)


def test_the_time_limit_stops_every_process_group(tmp_path):
    child = tmp_path / "child_pid"
    cmd = _script(
        tmp_path,
        f"""\
        import subprocess
        if index == 0:
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open({str(child)!r}, "w").write(str(p.pid))
        time.sleep(600)
        """,
    )
    out = io.BytesIO()
    start = time.monotonic()
    assert launch.run(cmd, workers=2, out=out, timeout_secs=3) == launch.TIMEOUT_EXIT
    assert time.monotonic() - start < 20
    assert "time limit of 3 s reached" in out.getvalue().decode()
    pid = int(child.read_text())
    # The grandchild was in worker:0's process group: it is gone too (reaped by init).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, r"`workers` must be an integer >= 1. Received: workers=0"),
        ({"workers": True}, r"`workers` must be an integer >= 1. Received: workers=True"),
        ({"workers": 1, "ps": -1}, r"`ps` must be an integer >= 0. Received: ps=-1"),
        ({"workers": 1, "timeout_secs": 0}, r"`timeout_secs` must be > 0"),
        ({"workers": 1, "grace_secs": -1}, r"`grace_secs` must be >= 0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        launch.run([sys.executable, "-c", "pass"], **kwargs)


def test_command_line_returns_the_failing_exit_code(tmp_path):
    cmd = _script(
        tmp_path,
        """\
        print("rank", index, "args", sys.argv[1:], flush=True)
        sys.exit(4 if index == 1 else 0)
        """,
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "npu_rec.launch",
            "--workers",
            "2",
            "--timeout_secs",
            "60",
            cmd[1],
            "--flag=1",
        ],
        capture_output=True,
        timeout=120,
        start_new_session=True,
    )
    assert proc.returncode == 4
    assert "[worker:0] rank 0 args ['--flag=1']" in proc.stdout.decode()


@pytest.mark.parametrize(
    "argv,own,module_args",
    [
        (
            ["--workers", "2", "-m", "pkg.train", "--max_steps=5"],
            ["--workers", "2", "-m", "pkg.train"],
            ["--max_steps=5"],
        ),
        (
            ["--chief", "-m", "pkg.train", "--ps", "1"],
            ["--chief", "-m", "pkg.train"],
            ["--ps", "1"],
        ),
        (
            ["--workers", "2", "script.py", "-m", "x"],
            ["--workers", "2", "script.py", "-m", "x"],
            [],
        ),
    ],
)
def test_a_module_keeps_every_argument_after_its_name(argv, own, module_args):
    """`-m MODULE --flag=1`: as with `python -m`, `--flag=1` is the module's, not the launcher's."""
    assert launch._split_module_args(argv) == (own, module_args)
