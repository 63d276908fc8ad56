r"""Exactly once from Kafka: SIGKILLs during training from a topic, then restarts.

It starts a Kafka cluster on 127.0.0.1 (`kafka_mock_broker.py`), writes generated
Criteo rows into a 4-partition topic, and for each front end trains with
`npu_rec.scripts.train --kafka=... --topic=...` (step saves every 2 steps) in a
subprocess that is SIGKILLed (its process group) a random delay after it commits a
new version, `--kills` times, the same command restarted each time; a last run
trains to `--max_steps`. Then, for every committed version of the model_dir, it
checks the saved reading position: the offsets of the next unread message of every
partition sum to `step * batch_size`, so the rows trained on by that version's
lineage are exactly the messages before those offsets, each once (a run killed
after a save and restarted re-read nothing the checkpoint had trained on and lost
nothing). It also checks that the group's offsets on the broker are never ahead of
the newest committed version.

Usage:
  python benchmarks/kafka_exactly_once.py --mode=short        # 1 kill per front end (CI)
  python benchmarks/kafka_exactly_once.py --mode=long --kills=10 --out=kafka.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCH = 32


def _env() -> dict:
    return dict(
        os.environ,
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="3",
    )


def start_broker(seconds: float):
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "kafka_mock_broker.py"),
            f"--seconds={seconds}",
            "--stop_on_stdin_eof",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return proc, proc.stdout.readline().strip()


def command(frontend, address, topic, model_dir, max_steps) -> list[str]:
    return [
        sys.executable,
        "-m",
        "npu_rec.scripts.train",
        f"--frontend={frontend}",
        f"--kafka={address}",
        f"--topic={topic}",
        f"--model_dir={model_dir}",
        f"--max_steps={max_steps}",
        "--save_steps=2",
        f"--batch_size={BATCH}",
        "--eval_steps=1",
        "--embedding_dim=4",
        "--verbose=0",
    ]


def commits(model_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(model_dir, "commits", "version-*.json")))


def run(cmd, model_dir: str, timeout: float, kill_delay: float | None):
    """Runs `cmd`; with `kill_delay`, SIGKILLs its group that long after a new commit."""
    before = len(commits(model_dir))
    proc = subprocess.Popen(
        cmd,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if kill_delay is not None and len(commits(model_dir)) > before:
                time.sleep(kill_delay)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return "killed", ""
            time.sleep(0.05)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout", ""
        err = proc.stderr.read().decode(errors="replace")
        return ("done" if proc.returncode == 0 else "failed"), err[-2000:]
    finally:
        proc.stderr.close()


def positions(model_dir: str) -> dict[int, dict]:
    """step -> the saved data state of every committed version."""
    from npu_rec.training._data_position import load_position

    out = {}
    for path in commits(model_dir):
        with open(path) as f:
            record = json.load(f)
        step = record.get("payload", record).get("step")
        for name in (f"state-{step:012d}.json", f"data_position-{step}.json"):
            p = os.path.join(model_dir, name)
            if os.path.exists(p):
                payload = load_position(p)
                out[int(step)] = payload.get("data", payload) if "data" in payload else payload
    return out


def broker_offsets(address: str, topic: str) -> list[int]:
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": address, "group.id": f"npu_rec-{topic}"})
    try:
        got = c.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=10)
        return [max(tp.offset, 0) for tp in got]
    finally:
        c.close()


def campaign(frontend, address, work, kills, max_steps, rng, run_timeout) -> dict:
    from npu_rec.scripts.produce_sample import generated_lines, produce

    topic = f"exactly-once-{frontend}"
    produce(address, topic, generated_lines(BATCH * (max_steps + 8), seed=1))
    model_dir = os.path.join(work, frontend)
    cmd = command(frontend, address, topic, model_dir, max_steps)
    outcomes, failures = [], []
    for _ in range(kills):
        outcome, err = run(cmd, model_dir, run_timeout, rng.uniform(0.0, 1.5))
        outcomes.append(outcome)
        if outcome != "killed":
            failures.append(err)
    outcome, err = run(cmd, model_dir, run_timeout, None)
    outcomes.append(outcome)
    if outcome != "done":
        failures.append(err)
    states = positions(model_dir)
    wrong = {
        step: s["offsets"]
        for step, s in states.items()
        if sum(s["offsets"].values()) != step * BATCH
    }
    newest = max(states) if states else 0
    on_broker = broker_offsets(address, topic)
    saved = [states[newest]["offsets"].get(str(p), 0) for p in range(4)] if states else []
    return {
        "frontend": frontend,
        "outcomes": outcomes,
        "failures": failures,
        "versions_checked": len(states),
        "final_step": newest,
        "positions_wrong": wrong,
        "broker_offsets": on_broker,
        "broker_ahead": any(b > s for b, s in zip(on_broker, saved, strict=False)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["short", "long"], default="short")
    parser.add_argument("--kills", type=int, default=None)
    parser.add_argument("--frontends", default="keras,estimator")
    parser.add_argument("--max_steps", type=int, default=None)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--run_timeout", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    kills = args.kills if args.kills is not None else (1 if args.mode == "short" else 10)
    max_steps = args.max_steps or (8 if args.mode == "short" else 40)
    work = args.work_dir or tempfile.mkdtemp(prefix="npu_rec_kafka_")
    rng = random.Random(args.seed)
    broker, address = start_broker(seconds=3600)
    try:
        results = [
            campaign(f, address, work, kills, max_steps, rng, args.run_timeout)
            for f in args.frontends.split(",")
        ]
    finally:
        broker.stdin.close()
        broker.wait(timeout=30)
    for r in results:
        print(
            f"{r['frontend']:10s} runs={r['outcomes']} versions={r['versions_checked']} "
            f"final_step={r['final_step']} wrong={len(r['positions_wrong'])} "
            f"broker_ahead={r['broker_ahead']}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
