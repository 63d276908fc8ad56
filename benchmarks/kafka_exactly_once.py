r"""Exactly once from Kafka: SIGKILLs during training from a topic, then restarts.

It starts a Kafka cluster on 127.0.0.1 (`kafka_mock_broker.py`) and writes N
generated Criteo rows into a 4-partition topic, row i carrying the text
`row<i>` in its last categorical column (C26): a key no other row shares. A
message holds `--rows_per_message` consecutive rows (line-separated; the last
message may hold fewer); with several, the batch size (32) does not divide it
(7 rows, say), so minibatches end inside messages and saves land there: the
saved position is then (offset of the first message not wholly trained on,
rows of it trained on) per partition. For each value of `--rows_per_message`
and each front end it trains from the topic in a subprocess (Keras:
`npu_rec.scripts.online_train`, step saves plus timed delta saves; Estimator:
`npu_rec.scripts.train --frontend=estimator`, step saves) that is SIGKILLed (its
process group) at a random point (0 to `--max_delay` s after its first to
third new commit; a run that ended before it is reported as
"ended_before_kill"), `--kills` times, the same command restarted each time; a
last run trains to `--max_steps`, where the N rows are used up. Each kill
records the step the next run resumes at, and whether that version's position
is inside a message (`restarts_mid_message`).

What a version trained on is read from the committed checkpoint itself: the
table keeps per key the number of training lookups (`counts`, saved with each
version and restored with it), so the `row<i>` keys of a version's table are the
rows its whole lineage trained on, with multiplicity, across every kill and
restart. For every committed version it checks:
  * each row key has count 1 (no row trained twice), and the rows are exactly
    those before the version's saved position (the messages before its offsets
    plus the first `rows` rows of the message at an offset), so the next run
    starts at the first row the version has not trained on;
  * the rows before the saved position number `step * batch_size`;
and for the final version that its rows are the N rows produced (none lost), and
that the group's offsets on the broker are not ahead of it (they may trail it: a
process killed right after a commit may not have sent that commit's offsets).

Usage:
  python benchmarks/kafka_exactly_once.py --mode=short   # 1 kill per front end and rows/message
  python benchmarks/kafka_exactly_once.py --mode=long --out=kafka.json   # 10 kills each
  python benchmarks/kafka_exactly_once.py --mode=long --rows_per_message=7   # 7 rows only
"""

from __future__ import annotations

import argparse
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
ROW_COLUMN = "C26"  # carries "row<i>"
TABLE = "categorical"  # the scripts' table shared by the categorical columns


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
    common = [
        f"--kafka={address}",
        f"--topic={topic}",
        f"--model_dir={model_dir}",
        f"--max_steps={max_steps}",
        f"--batch_size={BATCH}",
        "--eval_steps=1",
        "--embedding_dim=4",
        "--verbose=0",
    ]
    if frontend == "keras":  # RecModel.online_train: full saves by step, deltas by time
        return [
            sys.executable,
            "-m",
            "npu_rec.scripts.online_train",
            *common,
            "--save_steps=4",
            "--save_delta_checkpoints_secs=1",
            "--save_checkpoint_due_time=3600",
        ]
    return [
        sys.executable,
        "-m",
        "npu_rec.scripts.train",
        "--frontend=estimator",
        *common,
        "--save_steps=2",
    ]


def rows(n: int) -> list[bytes]:
    """`n` Criteo lines; line i's last field (C26) is `row<i>`."""
    from npu_rec.scripts.produce_sample import generated_lines

    return [
        line.rsplit(b",", 1)[0] + b",row%d" % i for i, line in enumerate(generated_lines(n, seed=1))
    ]


def row_keys(n: int) -> dict[int, int]:
    """Table key -> row number, as the scripts' model looks the rows' C26 text up."""
    import numpy as np

    from npu_rec.data import feature_key_salt
    from npu_rec.data._convert import hash_strings

    ids = hash_strings([f"row{i}" for i in range(n)]) ^ np.int64(feature_key_salt(ROW_COLUMN))
    keys = dict(zip(ids.tolist(), range(n), strict=True))
    assert len(keys) == n, "two row texts hash to one key"
    return keys


def message_rows(address: str, topic: str, n: int) -> dict[tuple[int, int], list[int]]:
    """(partition, offset) -> the row numbers, in order, of each of the `n` messages of
    `topic` (read back)."""
    import confluent_kafka as ck

    c = ck.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": f"check-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out = {}
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in range(4)])
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                if m.error() is None:
                    out[(m.partition(), m.offset())] = [
                        int(line.rsplit(b",row", 1)[1]) for line in m.value().split(b"\n")
                    ]
    finally:
        c.close()
    assert len(out) == n, f"read back {len(out)} of {n} messages"
    return out


def newest_step(model_dir: str) -> int:
    """The step of the newest committed version (0: none)."""
    from npu_rec.checkpoint import VersionLog

    if not os.path.isdir(os.path.join(model_dir, "commits")):
        return 0
    return max((v.step for v in VersionLog(model_dir).versions()), default=0)


def run(cmd, model_dir: str, timeout: float, kill: tuple[int, float] | None):
    """Runs `cmd`; with `kill=(k, delay)`, SIGKILLs its group `delay` s after its k-th commit.

    Returns (end, stderr's tail): "killed" (the process was still running when killed),
    "ended_before_kill", "done", "failed" or "timeout"."""
    from npu_rec.checkpoint import VersionLog

    log = VersionLog(model_dir)

    def committed() -> int:
        return len(log.versions()) if os.path.isdir(os.path.join(model_dir, "commits")) else 0

    before = committed()
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
            if kill is not None and committed() - before >= kill[0]:
                time.sleep(kill[1])
                running = proc.poll() is None
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return ("killed" if running else "ended_before_kill"), ""
            time.sleep(0.02)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout", ""
        err = proc.stderr.read().decode(errors="replace")
        return ("done" if proc.returncode == 0 else "failed"), err[-2000:]
    finally:
        proc.stderr.close()


def versions(model_dir: str) -> list[dict]:
    """Every committed version: its step, saved offsets and table key counts."""
    import numpy as np

    from npu_rec.checkpoint import VersionLog, read_file
    from npu_rec.checkpoint._versions import table_parts
    from npu_rec.training._data_position import load_position

    log = VersionLog(model_dir)
    found = log.versions()
    out = []
    for v in found:
        counts: dict[int, int] = {}
        for rel in table_parts(log.chain(v, found)):
            arrays, meta = read_file(os.path.join(model_dir, rel))
            if TABLE not in meta["tables"]:
                continue
            keys = arrays.get(f"tables/{TABLE}/keys", np.zeros(0, np.int64)).tolist()
            got = arrays.get(f"tables/{TABLE}/counts", np.zeros(0, np.int64)).tolist()
            if meta["kind"] == "full":
                counts = {}
            for k in arrays.get(f"tables/{TABLE}/deleted_keys", np.zeros(0, np.int64)).tolist():
                counts.pop(k, None)
            counts.update(zip(keys, got, strict=True))
        state = None
        for rel in v.parts:
            name = os.path.basename(rel)
            if name.startswith(("state-", "data_position-")):
                payload = load_position(os.path.join(model_dir, rel))
                state = payload.get("data", payload)
        out.append({"step": v.step, "kind": v.kind, "state": state, "counts": counts})
    return out


def broker_offsets(address: str, topic: str) -> list[int]:
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": address, "group.id": f"npu_rec-{topic}"})
    try:
        got = c.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=10)
        return [max(tp.offset, 0) for tp in got]
    finally:
        c.close()


def before_position(state: dict, where: dict[tuple[int, int], list[int]]) -> set[int]:
    """The rows before a saved reading position: per partition, those of the messages
    before its offset and the first `rows` rows of the message at its offset."""
    offsets = {int(p): int(o) for p, o in state["offsets"].items()}
    inside = {int(p): int(k) for p, k in (state.get("rows") or {}).items()}
    out = set()
    for (p, off), rows in where.items():
        if off < offsets.get(p, 0):
            out.update(rows)
        elif off == offsets.get(p, 0):
            out.update(rows[: inside.get(p, 0)])
    return out


def check_version(v: dict, keys: dict[int, int], where: dict[tuple[int, int], list[int]]) -> list:
    """What is wrong with one committed version (empty: nothing)."""
    problems = []
    trained = {keys[k]: c for k, c in v["counts"].items() if k in keys}
    twice = sorted(r for r, c in trained.items() if c != 1)
    if twice:
        problems.append(f"rows trained more than once: {twice[:10]}")
    if v["state"] is None:
        return [*problems, "no saved reading position"]
    below = before_position(v["state"], where)
    if len(below) != v["step"] * BATCH:
        problems.append(
            f"position {v['state']['offsets']} rows {v['state'].get('rows')} is "
            f"{len(below)} rows in, not step {v['step']} * {BATCH}"
        )
    if set(trained) != below:
        lost, extra = sorted(below - set(trained)), sorted(set(trained) - below)
        problems.append(
            f"rows trained != rows before the saved position: {len(lost)} not trained "
            f"{lost[:10]}, {len(extra)} beyond the offsets {extra[:10]}"
        )
    return problems


def campaign(
    frontend, address, work, kills, max_steps, rng, run_timeout, per_message, max_delay
) -> dict:
    from npu_rec.scripts.produce_sample import messages, produce

    n = BATCH * max_steps
    topic = f"exactly-once-{frontend}-{per_message}"
    sent = produce(address, topic, messages(rows(n), per_message))
    keys, where = row_keys(n), message_rows(address, topic, sent)
    assert sorted(r for rs in where.values() for r in rs) == list(range(n))
    model_dir = os.path.join(work, f"{frontend}-{per_message}")
    cmd = command(frontend, address, topic, model_dir, max_steps)
    runs, failures = [], []
    start = time.monotonic()
    for _ in range(kills):
        kill = (rng.randint(1, 3), rng.uniform(0.0, max_delay))
        outcome, err = run(cmd, model_dir, run_timeout, kill)
        runs.append(
            {
                "kill_after_commits": kill[0],
                "delay_s": round(kill[1], 3),
                "end": outcome,
                # The version the next run restores (the newest committed at the kill).
                "resumes_at_step": newest_step(model_dir),
            }
        )
        if outcome != "killed":
            failures.append(err)
    outcome, err = run(cmd, model_dir, run_timeout, None)
    runs.append({"end": outcome})
    if outcome != "done":
        failures.append(err)
    seconds = time.monotonic() - start
    found = versions(model_dir)
    problems = {v["step"]: p for v in found if (p := check_version(v, keys, where))}
    final = max(found, key=lambda v: v["step"]) if found else None
    by_step = {v["step"]: v for v in found}
    trained = sorted(keys[k] for k in final["counts"] if k in keys) if final else []
    on_broker = broker_offsets(address, topic)
    saved = [int(final["state"]["offsets"].get(str(p), 0)) for p in range(4)] if final else []
    inside = [
        bool(any(int(k) for k in (v["state"].get("rows") or {}).values()))
        if (v := by_step.get(r.get("resumes_at_step"))) and v["state"]
        else False
        for r in runs[:-1]
    ]
    return {
        "frontend": frontend,
        "rows_per_message": per_message,
        "messages": sent,
        "rows_produced": n,
        "runs": runs,
        "kills": sum(r["end"] == "killed" for r in runs),
        "failures": failures,
        "seconds": round(seconds, 1),
        "versions_checked": len(found),
        "delta_versions": sum(v["kind"] == "delta" for v in found),
        # Saved inside a message: some partition's position has rows of a message.
        # Restarts that resumed inside a message (passing its rows trained on).
        "restarts_mid_message": sum(inside),
        "versions_mid_message": sum(
            bool(v["state"] and any(int(k) for k in (v["state"].get("rows") or {}).values()))
            for v in found
        ),
        "final_step": final["step"] if final else 0,
        "rows_trained_final": len(trained),
        "every_row_once": trained == list(range(n)) and all(final["counts"][k] == 1 for k in keys),
        "version_problems": problems,
        "broker_offsets": on_broker,
        "broker_ahead": any(b > s for b, s in zip(on_broker, saved, strict=False)),
        # A process killed right after a commit may not have told the broker yet.
        "broker_lag": sum(saved) - sum(on_broker),
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
    parser.add_argument(
        "--max_delay", type=float, default=None, help="kill 0..max_delay s after the commit"
    )
    parser.add_argument(
        "--rows_per_message",
        default="1,7",
        help="rows per message; a comma list runs the campaign once per value (7: the "
        "batch of 32 rows ends inside messages)",
    )
    args = parser.parse_args(argv)
    per_message = [int(k) for k in args.rows_per_message.split(",")]
    if not per_message or min(per_message) < 1:
        raise ValueError(
            "`--rows_per_message` must list integers >= 1. "
            f"Received: --rows_per_message={args.rows_per_message!r}"
        )
    kills = args.kills if args.kills is not None else (1 if args.mode == "short" else 10)
    max_steps = args.max_steps or (64 if args.mode == "short" else 300)
    # Short runs train about 100 steps a second once started: a kill at most 0.2 s after
    # one of the first three commits (step 12 at most) lands well before step 64.
    max_delay = (
        args.max_delay if args.max_delay is not None else (0.2 if args.mode == "short" else 1.0)
    )
    work = args.work_dir or tempfile.mkdtemp(prefix="npu_rec_kafka_")
    rng = random.Random(args.seed)
    broker, address = start_broker(seconds=3600)
    try:
        results = []
        for k in per_message:
            for f in args.frontends.split(","):
                r = campaign(
                    f, address, work, kills, max_steps, rng, args.run_timeout, k, max_delay
                )
                results.append(r)
                print(
                    f"{r['frontend']:10s} rows/message={r['rows_per_message']} kills={r['kills']} "
                    f"runs={len(r['runs'])} versions={r['versions_checked']} "
                    f"(deltas {r['delta_versions']}, mid-message {r['versions_mid_message']}) "
                    f"restarts_mid_message={r['restarts_mid_message']} "
                    f"final_step={r['final_step']} "
                    f"rows={r['rows_trained_final']}/{r['rows_produced']} "
                    f"every_row_once={r['every_row_once']} "
                    f"problems={len(r['version_problems'])} "
                    f"broker_ahead={r['broker_ahead']} seconds={r['seconds']}",
                    flush=True,
                )
                if args.out:  # after each campaign: a cut long run keeps what it found
                    with open(args.out, "w") as out:
                        command = "python " + " ".join(sys.argv)
                        json.dump({"command": command, "results": results}, out, indent=1)
    finally:
        broker.stdin.close()
        broker.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
