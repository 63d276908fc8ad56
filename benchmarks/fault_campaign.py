r"""Fault campaign: SIGKILLs and a full disk during training and saves, then restarts.

For each front end (Keras, Estimator) it trains a small DeepFM with
`npu_rec/scripts/train.py` in subprocesses (each in its own process group, each with
a timeout), with step saves and timed full and delta saves
(`--incremental_checkpoint`):

* kills: a run is started, and once it has committed a new version it is
  SIGKILLed after a random delay (during training or a full or delta save);
  the same command is started again;
* full disk: the model_dir is a tmpfs (where mounting one is permitted),
  shrunk to its current use plus a random margin of 128-428 KB for one run,
  whose next save runs out of space (ENOSPC), then grown again for the same
  command; where no tmpfs can be mounted, the run gets `RLIMIT_FSIZE` below a
  checkpoint file's size instead (EFBIG);
* a last run with the same command trains to `--max_steps`.

The front ends named in `--compact` (default: keras) train compact tables,
bfloat16 rows with RowWiseAdagrad (`--value_dtype=bfloat16
--sparse_optimizer=rowwise_adagrad`), the others float32 rows with Adagrad; so
a kill during a save of a compact table is covered too.

Then it checks:

* resumed: every restart that committed a version continued from the newest
  committed version before it started (the commit record's `origin`), with
  no flag;
* corrupt: every committed version restores (chain and digests verify) and
  its tables and dense state equal those of an uninterrupted run at the same
  step (the reference run saves every step);
* lost / repeated samples: the data position of every committed version
  equals the reference's at that step;
* leftovers: temporary files or uncommitted parts left in the model_dir.

With `--campaign=corruption` it damages committed checkpoints instead: for
each front end it trains a run (step saves and timed full and delta saves),
then, for every kind of damage (`DAMAGE_KINDS`: a truncated, bit-flipped,
deleted, emptied or unreadable part, the newest delta's table file deleted, an
edited data position, a deleted commit record) in a copy of that model_dir:

* inspect: `python -m npu_rec.scripts.inspect_checkpoint` describes the damaged directory
  without failing, names the damaged file (or lists the parts left without a
  record), and lists as restorable exactly the versions a restore accepts
  (`VersionLog.select(step)`), the newest of them the one a restart takes;
* restart: the same training command resumes from that newest intact version
  (its first commit record's `origin`), every committed version then verifies,
  nothing intact is deleted (the damaged version's other files are still in
  the model_dir or under `retired/`) and no temporary file or uncommitted part
  is left.

With `--campaign=tier` the kills are aimed at a tiered table (`--memory_rows`,
default 200, and segments of `--segment_bytes`, so every step promotes and
demotes and segments seal and compact): each run is started with the
test-only `NPU_REC_TIER_KILL=<point>:<n>` (`npu_rec/table/_tier_store.py`),
which SIGKILLs it the n-th time (n drawn to land after a few steps) it
reaches a promotion, a demotion, a compaction or a save's read of the cold
tier; the same command is restarted. Then one run has its segment files
damaged while it trains (a byte of every written 8-byte word flipped, once it
has committed a version): it must fail naming a damaged file
(`SegmentCorruptedError`) and commit nothing from the damaged data, and the
restart resumes from the newest committed version. The checks are those of
the kills campaign (resumed, every version equal to the uninterrupted run's,
positions, leftovers), plus the segment directories left behind. Short mode
shares the four points between the front ends; long mode gives each front end
all four, `--kills` times each.

It prints a table and writes JSON (`--out`).

Usage:
  python benchmarks/fault_campaign.py --mode=short            # a few kills (CI)
  python benchmarks/fault_campaign.py --mode=long --kills=100 --out=fault_campaign.json
  python benchmarks/fault_campaign.py --campaign=corruption --mode=short   # (CI)
  python benchmarks/fault_campaign.py --campaign=corruption --mode=long --rounds=3
  python benchmarks/fault_campaign.py --mode=short --memory_rows=200   # tiered tables
  python benchmarks/fault_campaign.py --campaign=tier --mode=short     # aimed kills (CI)
  python benchmarks/fault_campaign.py --campaign=tier --mode=long --kills=3 --out=tier.json
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from npu_rec.checkpoint import (  # noqa: E402
    CheckpointCorruptedError,
    Version,
    VersionLog,
    _cold,  # noqa: E402
    read_file,
)
from npu_rec.checkpoint._versions import PART, RETIRED, TEMPORARY, table_parts, unseal  # noqa: E402
from npu_rec.table._tier_store import KILL_ENV, KILL_POINTS  # noqa: E402

_MODE = flags.DEFINE_enum("mode", "short", ["short", "long"], "short: a few kills (CI).")
_CAMPAIGN = flags.DEFINE_enum(
    "campaign",
    "kills",
    ["kills", "corruption", "tier"],
    "kills: SIGKILLs and a full disk; corruption: damaged checkpoints, inspected and restarted; "
    "tier: kills aimed at a tiered table's promotion, demotion, compaction and save, and "
    "damaged segment files.",
)
_RESTARTS = flags.DEFINE_integer(
    "restarts",
    None,
    "Corruption: damage kinds per front end and round that are restarted (a deleted commit "
    "record first, then random ones; the others are inspected in-process and checked against "
    "a restore); default 2 (short) or all (long).",
    lower_bound=0,
)
_KILLS = flags.DEFINE_integer(
    "kills",
    None,
    "SIGKILLs in all (split between the front ends); default 2 (short) or 100 (long). "
    "Tier campaign: kills per point and front end; default 1 (short) or 3 (long).",
    lower_bound=0,
)
_FRONTENDS = flags.DEFINE_list("frontends", ["keras", "estimator"], "Front ends to test.")
_COMPACT = flags.DEFINE_list(
    "compact",
    ["keras"],
    "Kills campaign: front ends whose tables store bfloat16 rows with RowWiseAdagrad (the "
    "others: float32 rows with Adagrad).",
)
_MAX_STEPS = flags.DEFINE_integer(
    "max_steps", None, "Steps of each training; default 24 (short) or 300 (long).", lower_bound=2
)
_ROUNDS = flags.DEFINE_integer(
    "rounds",
    None,
    "Fresh model_dirs per front end, the kills "
    "split between them; default 1 (short) or kills / 20 (long).",
    lower_bound=1,
)
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the kill times.")
_MEMORY_ROWS = flags.DEFINE_integer(
    "memory_rows",
    None,
    "Tiered tables: the runs train with --memory_rows=N and an --ssd_path beside the model_dir.",
    lower_bound=1,
)
_SEGMENT_BYTES = flags.DEFINE_integer(
    "segment_bytes",
    None,
    "Tiered tables: bytes of a segment file (NPU_REC_TIER_SEGMENT_BYTES); default 4096 in the "
    "tier campaign (segments seal and compact within a few steps), else the table's.",
    lower_bound=64,
)
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Where model_dirs go (default: a temp dir).")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
_RUN_TIMEOUT = flags.DEFINE_integer("run_timeout", 240, "Seconds before a run is killed.")

FSIZE_LIMIT = 40_000  # bytes: below a table file of the campaign's model


#: The train.py flags of each table configuration.
TABLE_FLAGS = {
    "float32/adagrad": [],
    "bfloat16/rowwise_adagrad": ["--value_dtype=bfloat16", "--sparse_optimizer=rowwise_adagrad"],
}


def table_config(frontend: str) -> str:
    """The table configuration (a `TABLE_FLAGS` key) a front end's kills campaign trains."""
    return "bfloat16/rowwise_adagrad" if frontend in _COMPACT.value else "float32/adagrad"


def command(
    frontend: str, model_dir: str, save_steps: int, max_steps: int, tables: str = "float32/adagrad"
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "npu_rec.scripts.train",
        f"--frontend={frontend}",
        f"--model_dir={model_dir}",
        f"--max_steps={max_steps}",
        f"--save_steps={save_steps}",
        "--batch_size=32",
        "--eval_steps=1",
        "--embedding_dim=4",
        "--verbose=0",
        "--incremental_checkpoint",
        "--save_delta_checkpoints_secs=1",
        "--save_checkpoint_due_time=3",
        *TABLE_FLAGS[tables],
        *_tier_flags(model_dir),
    ]


def _tier_flags(model_dir: str) -> list[str]:
    """--memory_rows and --ssd_path of a tiered campaign (`--memory_rows`), else none."""
    rows = _MEMORY_ROWS.value if flags.FLAGS.is_parsed() else None
    if rows is None and flags.FLAGS.is_parsed() and _CAMPAIGN.value == "tier":
        rows = 200
    if rows is None:
        return []
    return [f"--memory_rows={rows}", f"--ssd_path={model_dir.rstrip(os.sep)}_ssd"]


def _env() -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    env.pop(KILL_ENV, None)
    if flags.FLAGS.is_parsed():
        size = _SEGMENT_BYTES.value
        if size is None and _CAMPAIGN.value == "tier":
            size = 4096
        if size is not None:
            env["NPU_REC_TIER_SEGMENT_BYTES"] = str(size)
    return env


def _seqs(model_dir: str) -> int:
    log = VersionLog(model_dir)
    if log.legacy:
        return 0
    found = log.versions()
    return found[-1].seq if found else 0


def run(
    cmd,
    timeout: float,
    kill_delay: float | None = None,
    fsize: int | None = None,
    env: dict | None = None,
    after_commit=None,
):
    """Runs `cmd`; with `kill_delay`, SIGKILLs its group that long after its first commit.

    `env`: more environment variables. `after_commit`: called once with the
    process's pid `kill_delay` (or 0) seconds after its first commit.

    Returns (outcome, pid, stderr's tail): outcome "done", "killed" (by the
    campaign, or by itself: a SIGKILL status), "failed" or "timeout".
    """
    model_dir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--model_dir="))
    before = _seqs(model_dir)

    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    proc = subprocess.Popen(
        cmd,
        env={**_env(), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=limit,
    )
    deadline = time.monotonic() + timeout
    kill_at = None
    watch = kill_delay is not None or after_commit is not None
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if watch and kill_at is None and _seqs(model_dir) > before:
                kill_at = time.monotonic() + (kill_delay or 0.0)
            if kill_at is not None and time.monotonic() >= kill_at:
                if after_commit is not None:
                    after_commit(proc.pid)
                    after_commit = kill_at = None
                    watch = False
                    continue
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return "killed", proc.pid, ""
            time.sleep(0.02)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return "timeout", proc.pid, ""
        err = proc.stderr.read().decode(errors="replace")
        if proc.returncode == -signal.SIGKILL:  # killed itself (NPU_REC_TIER_KILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything it started
            return "killed", proc.pid, err[-2000:]
        return ("done" if proc.returncode == 0 else "failed"), proc.pid, err[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stderr.close()


# --------------------------------------------------------------- version state
def tables_at(model_dir: str, chain) -> dict:
    """table -> {key: row} after applying the chain's table files."""
    tables: dict[str, dict] = {}
    for rel in table_parts(chain):
        arrays, meta = read_file(os.path.join(model_dir, rel))
        for name in meta["tables"]:
            rows = tables.setdefault(name, {}) if meta["kind"] == "delta" else {}
            tables[name] = rows
            cold = _cold.table_files(os.path.join(model_dir, rel), meta, arrays, name)
            if cold is not None:  # a tiered table's cold records, beside the file
                got = _cold.read_rows(cold, np.zeros(0, np.int64))
                rows.update(zip(got["keys"].tolist(), got["values"], strict=True))
            for key in arrays.get(f"tables/{name}/deleted_keys", np.zeros(0)).tolist():
                rows.pop(key, None)
            keys = arrays[f"tables/{name}/keys"].tolist()
            values = arrays[f"tables/{name}/values"]
            rows.update(zip(keys, values, strict=True))
    return tables


def dense_at(model_dir: str, version) -> dict:
    npz = version.part("dense-")
    if npz is not None:
        with np.load(os.path.join(model_dir, npz)) as data:
            return {k: data[k] for k in data.files}
    import tensorflow as tf

    index = version.part("model.ckpt-")
    prefix = os.path.join(model_dir, index.split(".index")[0].split(".data-")[0])
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def position_at(model_dir: str, version):
    part = version.part("state-") or version.part("data_position-")
    if part is None:
        return None
    payload = unseal(os.path.join(model_dir, part))
    return payload.get("data", payload) if part.startswith("state-") else payload


def state_of(model_dir: str, version, chain) -> dict:
    return {
        "tables": tables_at(model_dir, chain),
        "dense": dense_at(model_dir, version),
        "position": position_at(model_dir, version),
    }


def max_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two states (inf if their shapes differ)."""
    worst = 0.0
    if a["tables"].keys() != b["tables"].keys() or a["dense"].keys() != b["dense"].keys():
        return float("inf")
    for name, rows in a["tables"].items():
        other = b["tables"][name]
        if rows.keys() != other.keys():
            return float("inf")
        for key, row in rows.items():
            diff = np.abs(np.asarray(row, np.float64) - np.asarray(other[key], np.float64))
            worst = max(worst, float(np.max(diff, initial=0.0)))
    for name, value in a["dense"].items():
        if np.shape(value) != np.shape(b["dense"][name]):
            return float("inf")
        diff = np.abs(np.asarray(value, np.float64) - np.asarray(b["dense"][name], np.float64))
        worst = max(worst, float(np.max(diff, initial=0.0)))
    return worst


def leftovers(model_dir: str) -> list[str]:
    """Temporary files and parts no committed version owns."""
    owned = VersionLog(model_dir).owned()
    out = []
    for folder, dirs, files in os.walk(model_dir):
        rel_folder = os.path.relpath(folder, model_dir)
        if rel_folder.split(os.sep)[0] == RETIRED:
            continue
        for name in files + dirs:
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            if TEMPORARY.match(name) or (PART.match(rel) and rel not in owned):
                out.append(rel)
            elif _cold.MARK in name and name in dirs:  # a tiered table's cold records
                path = os.path.join(folder, name.split(_cold.MARK)[0] + ".nrc")
                if not os.path.exists(path) or _cold.named(path) != os.path.join(folder, name):
                    out.append(rel)
    return out


# -------------------------------------------------------------------- campaign
def start_reference(frontend: str, work: str, max_steps: int):
    """The uninterrupted run (a version at every step) the campaign is compared with."""
    ref_dir = os.path.join(work, frontend + "_reference")
    shutil.rmtree(ref_dir, ignore_errors=True)
    return ref_dir, subprocess.Popen(
        command(frontend, ref_dir, 1, max_steps, table_config(frontend)),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def campaign(
    frontend: str,
    kills: int,
    rounds: int,
    work: str,
    rng: random.Random,
    max_steps: int,
    timeout: float,
) -> dict:
    """`kills` SIGKILLs and one full-disk run per round, each round in a fresh model_dir."""
    ref_dir, ref = start_reference(frontend, work, max_steps)
    result = {
        "frontend": frontend,
        "tables": table_config(frontend),
        "rounds": rounds,
        "kills": 0,
        "full_disk_runs": 0,
        "failed_restarts": [],
        "restarts_checked": 0,
        "resumed_from_newest": 0,
        "versions_compared": 0,
        "corrupt_or_inconsistent": 0,
        "positions_differing": 0,
        "max_difference": 0.0,
        "leftovers": [],
    }
    start = time.monotonic()
    dirs = []
    for r in range(rounds):
        share = kills // rounds + (r < kills % rounds)
        model_dir = os.path.join(work, f"{frontend}_{r}")
        shutil.rmtree(model_dir, ignore_errors=True)
        result["tmpfs"] = mount_tmpfs(model_dir)
        dirs.append((model_dir, one_round(result, model_dir, share, rng, max_steps, timeout)))
    try:
        ref.wait(timeout=max(60.0, 4 * timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        os.killpg(ref.pid, signal.SIGKILL)
        ref.wait(timeout=30)
    result["seconds"] = round(time.monotonic() - start, 1)
    for model_dir, expected in dirs:
        try:
            check(result, model_dir, ref_dir, expected)
        finally:
            if os.path.ismount(model_dir):
                subprocess.run(["umount", model_dir], timeout=60, check=False)
    return result


def mount_tmpfs(path: str) -> bool:
    """Mounts a tmpfs on `path` (created); False where that is not permitted."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", path],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def _resize(path: str, size: int) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,size={size}", path], check=True, timeout=30, capture_output=True
    )


def full_disk_run(cmd, model_dir: str, rng: random.Random, timeout: float):
    """A run whose disk fills up: a shrunk tmpfs, or RLIMIT_FSIZE without one."""
    if not os.path.ismount(model_dir):
        return run(cmd, timeout, fsize=FSIZE_LIMIT)
    stat = os.statvfs(model_dir)
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    graph = os.path.join(model_dir, "graph.pbtxt")  # rewritten at start, and in events
    spare = 3 * os.path.getsize(graph) if os.path.exists(graph) else 0  # + events file
    _resize(model_dir, used + spare + rng.randint(0, 300_000) + (1 << 20) // 8)
    try:
        return run(cmd, timeout)
    finally:
        _resize(model_dir, 1 << 30)


def one_round(
    result: dict, model_dir: str, kills: int, rng: random.Random, max_steps: int, timeout: float
) -> dict:
    """Kills, a full-disk run and the final run in `model_dir`; returns pid -> expected origin."""
    cmd = command(result["frontend"], model_dir, 4, max_steps, result["tables"])
    expected: dict[int, str | None] = {}  # pid -> id of the newest committed version
    plan = ["kill"] * kills
    plan.insert(min(1, len(plan)), "full_disk")  # early, while there are steps left
    for what in plan + ["finish"]:
        latest = VersionLog(model_dir).latest() if os.path.isdir(model_dir) else None
        if what == "kill":
            outcome, pid, err = run(cmd, timeout, kill_delay=rng.uniform(0.0, 1.5))
            result["kills"] += outcome == "killed"
        elif what == "full_disk":
            outcome, pid, err = full_disk_run(cmd, model_dir, rng, timeout)
            result["full_disk_runs"] += 1
            lines = [ln for ln in err.splitlines() if ln.strip()]
            result.setdefault("full_disk_errors", []).append(lines[-1][:200] if lines else outcome)
            result["full_disk_not_hit"] = result.get("full_disk_not_hit", 0) + (outcome == "done")
        else:
            outcome, pid, err = run(cmd, timeout)
            if outcome != "done":
                result["failed_restarts"].append(f"final run {outcome}: {err}")
        if what == "kill" and outcome == "failed":
            result["failed_restarts"].append(f"restart failed: {err}")
        expected[pid] = None if latest is None else latest.id
    return expected


def _cold_inodes(model_dir: str, chain) -> set[int]:
    """Inodes of the cold segment files (tiered tables) of `chain`'s table files."""
    out = set()
    for rel in table_parts(chain):
        with contextlib.suppress(OSError, CheckpointCorruptedError):
            folder = _cold.named(os.path.join(model_dir, rel))
            for root, _, files in os.walk(folder or os.devnull):
                out.update(os.stat(os.path.join(root, f)).st_ino for f in files)
    return out


def _refused_damaged(result: dict, log: VersionLog, v, found, damaged: set) -> bool:
    """Whether `v` links a damaged segment file; if so, its version check must refuse it."""
    if (
        v.id in result["_refused_ids"]
        or not _cold_inodes(log.directory, log.chain(v, found)) & damaged
    ):
        return v.id in result["_refused_ids"]
    result["_refused_ids"].add(v.id)
    try:
        log.verify(log.chain(v, found))
    except CheckpointCorruptedError as err:
        result["versions_refused_damaged"] += 1
        result["damaged_version_errors"].append(str(err)[:300])
    else:  # damaged bytes that verify: undetected corruption
        result["corrupt_or_inconsistent"] += 1
        result["failed_restarts"].append(f"version {v.step}: damage not detected")
    return True


def newest_intact(model_dir: str) -> Version | None:
    """The version a restart restores: the newest whose chain verifies."""
    if not os.path.isdir(model_dir):
        return None
    try:
        return VersionLog(model_dir).select()[0]
    except CheckpointCorruptedError:
        return None


def check(result: dict, model_dir: str, ref_dir: str, expected: dict) -> None:
    log, ref_log = VersionLog(model_dir), VersionLog(ref_dir)
    found = log.versions()
    first_of = {}
    for v in found:
        first_of.setdefault(v.pid, v)
    for pid, origin in expected.items():
        if pid in first_of:
            result["restarts_checked"] += 1
            result["resumed_from_newest"] += first_of[pid].origin == origin
    reference = {v.step: v for v in ref_log.versions()}
    # Segment files the campaign damaged, hard-linked into the versions saved meanwhile.
    damaged = set(result.pop("_damaged_inodes", []))
    for v in found:
        if damaged and _refused_damaged(result, log, v, found, damaged):
            continue
        try:
            chain = log.chain(v, found)
            log.verify(chain)
            got = state_of(model_dir, v, chain)
        except Exception as err:  # any failure to restore counts
            result["corrupt_or_inconsistent"] += 1
            result["failed_restarts"].append(f"version {v.step}: {err}")
            continue
        ref = reference.get(v.step)
        if ref is None:
            continue
        want = state_of(ref_dir, ref, ref_log.chain(ref))
        diff = max_difference(got, want)
        result["versions_compared"] += 1
        result["max_difference"] = max(result["max_difference"], diff)
        if diff > 1e-4:
            result["corrupt_or_inconsistent"] += 1
        if got["position"] != want["position"]:
            result["positions_differing"] += 1
    result["leftovers"] += leftovers(model_dir)


# ---------------------------------------------------------------- tier (aimed)
#: Times a point is reached per training step of the campaign's model (two
#: tiered tables, memory_rows=200, 4 KiB segments; measured, both front ends).
TIER_RATES = {"promotion": 1.8, "demotion": 1.9, "compaction": 0.9, "save": 0.6}


def flip_segments(ssd_dir: str, pid: int, inodes: set | None = None) -> list[str]:
    """Flips a bit of every written 8-byte word of process `pid`'s segment files.

    Returns the files damaged (relative to `ssd_dir`); adds their inodes to
    `inodes` (a full save hard-links sealed segments into its version, so
    those versions hold the damaged bytes too). Only the words written so
    far (up to the file's last non-zero byte) change, in place, so records the
    process appends meanwhile stay as written.
    """
    flipped = []
    if not os.path.isdir(ssd_dir):
        return flipped
    mine = re.compile(rf".+\.{pid}\.\d+$")
    for entry in sorted(os.listdir(ssd_dir)):
        folder = os.path.join(ssd_dir, entry)
        if not mine.match(entry) or not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".npr"):
                continue
            try:
                fd = os.open(os.path.join(folder, name), os.O_RDWR)
            except FileNotFoundError:  # deleted meanwhile (empty or compacted)
                continue
            try:
                data = np.frombuffer(os.pread(fd, os.fstat(fd).st_size, 0), np.uint8)
                written = np.flatnonzero(data)
                if not len(written):
                    continue
                end = -(-(int(written[-1]) + 1) // 8) * 8
                damaged = data[:end].copy()
                damaged[::8] ^= 1
                os.pwrite(fd, damaged.tobytes(), 0)
                flipped.append(f"{entry}/{name}")
                if inodes is not None:
                    inodes.add(os.fstat(fd).st_ino)
            finally:
                os.close(fd)
    return flipped


def tier_round(
    result: dict,
    model_dir: str,
    points: list[str],
    kills: int,
    rng: random.Random,
    max_steps: int,
    timeout: float,
) -> dict:
    """Aimed kills, a run with damaged segments and the final run; returns pid -> origin."""
    cmd = command(result["frontend"], model_dir, 4, max_steps, result["tables"])
    ssd_dir = model_dir.rstrip(os.sep) + "_ssd"
    expected: dict[int, str | None] = {}
    plan = [p for p in points for _ in range(kills)] + ["corrupt", "finish"]
    damaged: set[int] = set()
    for what in plan:
        # The newest version whose files verify (after the damage, the versions
        # holding a damaged segment file are refused by name; see `check`).
        if damaged:  # before a restart retires them: versions linking a damaged file
            log = VersionLog(model_dir)
            found = log.versions()
            for v in found:
                _refused_damaged(result, log, v, found, damaged)
        latest = newest_intact(model_dir)
        if what in KILL_POINTS:
            n = max(1, round(TIER_RATES[what] * rng.uniform(5, 12)))
            outcome, pid, err = run(cmd, timeout, env={KILL_ENV: f"{what}:{n}"})
            if outcome == "killed":
                result["kills"][what] += 1
            elif outcome == "done":  # finished before the n-th time: nothing to check
                result["not_reached"].append(f"{what}:{n}")
            else:
                result["failed_restarts"].append(f"{what}:{n} run {outcome}: {err}")
        elif what == "corrupt":
            hurt: dict = {}

            def damage_segments(pid, hurt=hurt):
                hurt["seq"] = _seqs(model_dir)
                hurt["files"] = flip_segments(ssd_dir, pid, damaged)

            outcome, pid, err = run(cmd, timeout, after_commit=damage_segments)
            files = hurt.get("files", [])
            result["segments_damaged"] += len(files)
            named = outcome == "failed" and any(os.path.basename(f) in err for f in files)
            # (a front end may print the message alone: "segment file '...' is corrupted")
            named = named and ("SegmentCorruptedError" in err or "segment file '" in err)
            result["corruption_refused_by_name"] += named
            if not named:
                result["failed_restarts"].append(
                    f"damaged segments {files}: run {outcome}, not refused by name: {err}"
                )
            # A save that read the cold tier before the damage may still commit.
            after = _seqs(model_dir) - hurt.get("seq", 0)
            result["versions_after_corruption"] = max(result["versions_after_corruption"], after)
            at = err.find("SegmentCorruptedError")
            shown = err[at : at + 300] if at >= 0 else err[-300:]
            result["corruption_errors"].append(shown.replace(ssd_dir, "<ssd_path>"))
        else:
            outcome, pid, err = run(cmd, timeout)
            if outcome != "done":
                result["failed_restarts"].append(f"final run {outcome}: {err}")
        expected[pid] = None if latest is None else latest.id
    left = []
    if os.path.isdir(ssd_dir):
        left = [os.path.join(d, f) for d, _, fs in os.walk(ssd_dir) for f in fs]
    result["segment_leftovers"] += [os.path.relpath(f, ssd_dir) for f in left]
    result["_damaged_inodes"] = sorted(damaged)
    return expected


def tier_campaign(
    frontend: str,
    points: list[str],
    kills: int,
    work: str,
    rng: random.Random,
    max_steps: int,
    timeout: float,
) -> dict:
    """`kills` aimed kills at each of `points`, then damaged segments, in one model_dir."""
    ref_dir, ref = start_reference(frontend, work, max_steps)
    result = {
        "frontend": frontend,
        "tables": table_config(frontend),
        "memory_rows": _tier_flags(ref_dir)[0].split("=")[1],
        "segment_bytes": _env().get("NPU_REC_TIER_SEGMENT_BYTES"),
        "kernels": os.environ.get("NPU_REC_KERNELS", "auto"),
        "points": points,
        "kills": dict.fromkeys(points, 0),
        "not_reached": [],
        "segments_damaged": 0,
        "corruption_refused_by_name": 0,
        "versions_after_corruption": 0,
        "versions_refused_damaged": 0,
        "_refused_ids": set(),
        "damaged_version_errors": [],
        "corruption_errors": [],
        "failed_restarts": [],
        "restarts_checked": 0,
        "resumed_from_newest": 0,
        "versions_compared": 0,
        "corrupt_or_inconsistent": 0,
        "positions_differing": 0,
        "max_difference": 0.0,
        "leftovers": [],
        "segment_leftovers": [],
    }
    start = time.monotonic()
    model_dir = os.path.join(work, f"{frontend}_tier")
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.rmtree(model_dir + "_ssd", ignore_errors=True)
    expected = tier_round(result, model_dir, points, kills, rng, max_steps, timeout)
    try:
        ref.wait(timeout=max(60.0, 4 * timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        os.killpg(ref.pid, signal.SIGKILL)
        ref.wait(timeout=30)
    result["seconds"] = round(time.monotonic() - start, 1)
    check(result, model_dir, ref_dir, expected)
    del result["_refused_ids"]
    return result


TIER_COLUMNS = [
    "frontend",
    "tables",
    "kills",
    "corruption_refused_by_name",
    "versions_after_corruption",
    "versions_refused_damaged",
    "restarts_checked",
    "resumed_from_newest",
    "versions_compared",
    "corrupt_or_inconsistent",
    "positions_differing",
    "max_difference",
    "seconds",
]


def main_tier():
    kills = _KILLS.value if _KILLS.value is not None else (1 if _MODE.value == "short" else 3)
    max_steps = _MAX_STEPS.value or (24 if _MODE.value == "short" else 200)
    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="npu_rec_tier_faults_")
    fronts = _FRONTENDS.value
    if _MODE.value == "short":  # the points shared between the front ends
        shares = [list(KILL_POINTS[i :: len(fronts)]) for i in range(len(fronts))]
    else:
        shares = [list(KILL_POINTS)] * len(fronts)
    with concurrent.futures.ThreadPoolExecutor(len(fronts)) as pool:
        jobs = [
            pool.submit(
                tier_campaign,
                frontend,
                shares[i],
                kills,
                work,
                random.Random(_SEED.value * 1000 + i),
                max_steps,
                _RUN_TIMEOUT.value,
            )
            for i, frontend in enumerate(fronts)
        ]
        results = [job.result() for job in jobs]
    print(" | ".join(TIER_COLUMNS))
    for r in results:
        print(
            " | ".join(str(r[c]) for c in TIER_COLUMNS)
            + f" | not_reached={r['not_reached']} | leftovers={len(r['leftovers'])}"
            f" | segment_leftovers={len(r['segment_leftovers'])}"
            f" | failures={len(r['failed_restarts'])}"
        )
    for r in results:
        for failure in r["failed_restarts"] + r["leftovers"] + r["segment_leftovers"]:
            print(f"{r['frontend']}: {failure}")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(
                {
                    "campaign": "tier",
                    "mode": _MODE.value,
                    "kills_per_point": kills,
                    "max_steps": max_steps,
                    # without the paths of this machine (--work_dir, --out)
                    "command": " ".join(
                        a for a in sys.argv if not a.startswith(("--work_dir", "--out"))
                    ),
                    "results": results,
                },
                f,
                indent=1,
            )


# ------------------------------------------------------------------ corruption
DAMAGE_KINDS = (
    "truncate",
    "flip",
    "delete_part",
    "delete_newest_delta",
    "edit_state",
    "delete_commit_record",
    "empty_file",
    "unreadable",
)


def damage(model_dir: str, kind: str, rng: random.Random) -> dict | None:
    """Damages one committed version of `model_dir`; None where `kind` does not apply.

    Returns `{"kind", "step", "id", "file"}`: the version and the file damaged.
    """
    found = VersionLog(model_dir).versions()
    newest = found[-1]
    version = newest
    if kind == "delete_newest_delta":
        deltas = [v for v in found if v.kind == "delta"]
        if not deltas:
            return None
        version = deltas[-1]
        rel = table_parts([version])[0]
    elif kind == "delete_commit_record":
        rel = f"commits/version-{version.seq:012d}.json"
    elif kind == "edit_state":
        rel = version.part("state-") or version.part("data_position-")
        if rel is None:
            return None
    elif kind == "delete_part":
        rel = rng.choice(sorted(p for p in version.parts if not p.startswith("tables/")))
    else:
        if kind == "flip":
            version = rng.choice(found)
        rel = rng.choice(sorted(version.parts))
    path = os.path.join(model_dir, rel)
    if kind in ("delete_newest_delta", "delete_commit_record", "delete_part"):
        os.remove(path)
    elif kind == "truncate":
        with open(path, "r+b") as f:
            f.truncate(rng.randint(1, max(1, os.path.getsize(path) - 1)))
    elif kind == "flip":
        with open(path, "r+b") as f:
            at = rng.randrange(os.path.getsize(path))
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    elif kind == "edit_state":
        with open(path) as f:
            data = json.load(f)
        payload = data.get("payload", data)
        payload["edited_by_hand"] = True  # valid JSON, not what was committed
        with open(path, "w") as f:
            json.dump(data, f)
    elif kind == "empty_file":
        open(path, "wb").close()
    elif kind == "unreadable":
        if os.geteuid() == 0:  # root reads any mode: a directory in the file's place
            os.remove(path)
            os.mkdir(path)
        else:
            os.chmod(path, 0)
    return {"kind": kind, "step": version.step, "id": version.id, "file": rel}


def inspect(model_dir: str, timeout: float, script: bool) -> tuple[dict | None, str]:
    """inspect_checkpoint's description (`--json`): the script, or its function in-process."""
    if not script:
        from npu_rec.scripts import _checkpoints  # noqa: PLC0415

        try:
            return _checkpoints.describe(model_dir), ""
        except Exception as err:  # a crash is what the campaign counts
            return None, f"{type(err).__name__}: {err}"
    done = subprocess.run(
        [sys.executable, "-m", "npu_rec.scripts.inspect_checkpoint"]
        + [f"--model_dir={model_dir}", "--json"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        return None, f"exit status {done.returncode}: {done.stderr[-1000:]}"
    return json.loads(done.stdout), ""


def restorable_by_restore(model_dir: str) -> tuple[list[Version], Version | None]:
    """The committed versions a restore accepts (`select(step)`), and the one a restart takes."""
    log = VersionLog(model_dir)
    ok = []
    for v in log.versions():
        try:
            log.select(v.step)
            ok.append(v)
        except Exception:  # damaged: the restore refuses it
            pass
    try:
        newest = log.select()[0]
    except Exception:  # every version damaged
        newest = None
    return ok, newest


def named(info: dict, hurt: dict) -> bool:
    """Whether the description names the damaged file at the damaged version."""
    for v in info["versions"]:
        if v["step"] != hurt["step"]:
            continue
        if hurt["kind"] == "delete_commit_record":
            if v["status"] == "uncommitted":
                return True
        elif v["status"] == "damaged" and hurt["file"] in v.get("problem", ""):
            return True
    return False


def kept_intact(model_dir: str, parts: dict, hurt: dict) -> bool:
    """Whether every part of the damaged version but the damaged file still exists somewhere."""
    retired = os.path.join(model_dir, RETIRED)
    batches = os.listdir(retired) if os.path.isdir(retired) else []
    for rel in parts:
        if rel == hurt["file"]:
            continue
        if not os.path.exists(os.path.join(model_dir, rel)) and not any(
            os.path.exists(os.path.join(retired, b, rel)) for b in batches
        ):
            return False
    return True


def corruption_campaign(
    frontend: str,
    rounds: int,
    work: str,
    rng: random.Random,
    max_steps: int,
    timeout: float,
    restarts: int | None,
) -> dict:
    """Every damage kind in a copy of a trained model_dir, per round: inspected, restarted."""
    result = {
        "frontend": frontend,
        "rounds": rounds,
        "damaged_dirs": 0,
        "not_applicable": [],
        "inspect_runs": 0,
        "inspect_crashes": 0,
        "damage_named": 0,
        "inspect_agrees_with_restore": 0,
        "restarts": 0,
        "resumed_from_newest_intact": 0,
        "intact_files_kept": 0,
        "versions_verified_after": 0,
        "corrupt_after": 0,
        "leftovers": [],
        "failed_restarts": [],
        "damage": [],
    }
    start = time.monotonic()
    for r in range(rounds):
        base = os.path.join(work, f"{frontend}_corruption_base_{r}")
        shutil.rmtree(base, ignore_errors=True)
        # Timed saves only (full every 3 s, delta every second) and the final full save,
        # so the directory holds deltas.
        outcome, _, err = run(command(frontend, base, 100 * max_steps, max_steps), timeout)
        if outcome != "done":
            result["failed_restarts"].append(f"base run {outcome}: {err}")
            continue
        kinds = list(DAMAGE_KINDS)
        if restarts is None:
            restarted = set(kinds)
        else:  # a lost commit record first: the one whose restart moves files aside
            others = [k for k in kinds if k != "delete_commit_record"]
            picked = ["delete_commit_record"] + rng.sample(others, len(others))
            restarted = set(picked[:restarts])
        for kind in kinds:
            model_dir = os.path.join(work, f"{frontend}_{kind}_{r}")
            shutil.rmtree(model_dir, ignore_errors=True)
            shutil.copytree(base, model_dir)
            before = {v.id: v for v in VersionLog(model_dir).versions()}
            hurt = damage(model_dir, kind, rng)
            if hurt is None:
                result["not_applicable"].append(kind)
                continue
            result["damaged_dirs"] += 1
            result["damage"].append(hurt)
            info, err = inspect(model_dir, timeout, script=kind in restarted)
            result["inspect_runs"] += 1
            if info is None:
                result["inspect_crashes"] += 1
                result["failed_restarts"].append(f"inspect after {kind}: {err}")
                continue
            result["damage_named"] += named(info, hurt)
            intact, newest = restorable_by_restore(model_dir)
            accepted = [v.step for v in intact]
            agrees = info["restore_model_version"] == accepted and (
                newest is None or accepted[-1:] == [newest.step]
            )
            result["inspect_agrees_with_restore"] += agrees
            if not agrees:
                result["failed_restarts"].append(
                    f"{kind}: inspect lists {info['restore_model_version']}, a restore "
                    f"accepts {accepted}"
                )
            if kind not in restarted:
                continue
            cmd = command(frontend, model_dir, 100 * max_steps, max_steps + 4)
            outcome, pid, err = run(cmd, timeout)
            result["restarts"] += 1
            if outcome != "done":
                result["failed_restarts"].append(f"restart after {kind} {outcome}: {err}")
                continue
            log = VersionLog(model_dir)
            found = log.versions()
            first = next((v for v in found if v.pid == pid), None)
            resumed = first is not None and first.origin == (newest.id if newest else None)
            result["resumed_from_newest_intact"] += resumed
            if not resumed:
                result["failed_restarts"].append(
                    f"restart after {kind}: resumed from {first and first.origin}, the newest "
                    f"intact version is {newest and newest.id}"
                )
            kept = kept_intact(model_dir, before[hurt["id"]].parts, hurt)
            result["intact_files_kept"] += kept
            if not kept:
                result["failed_restarts"].append(f"restart after {kind}: deleted intact files")
            was_damaged = set(before) - {v.id for v in intact}
            for v in found:
                if v.id in was_damaged:  # an older damaged version training left alone
                    continue
                try:
                    log.verify(log.chain(v, found))
                    result["versions_verified_after"] += 1
                except Exception as err:  # any failure to restore counts
                    result["corrupt_after"] += 1
                    result["failed_restarts"].append(f"after {kind}, version {v.step}: {err}")
            result["leftovers"] += [f"{kind}: {rel}" for rel in leftovers(model_dir)]
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


CORRUPTION_COLUMNS = [
    "frontend",
    "rounds",
    "damaged_dirs",
    "inspect_runs",
    "inspect_crashes",
    "damage_named",
    "inspect_agrees_with_restore",
    "restarts",
    "resumed_from_newest_intact",
    "intact_files_kept",
    "versions_verified_after",
    "corrupt_after",
    "seconds",
]


def main_corruption():
    max_steps = _MAX_STEPS.value or (200 if _MODE.value == "short" else 400)
    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="npu_rec_corruption_")
    fronts = _FRONTENDS.value
    rounds = _ROUNDS.value or (1 if _MODE.value == "short" else 3)
    restarts = _RESTARTS.value
    if restarts is None and _MODE.value == "short":
        restarts = 2
    with concurrent.futures.ThreadPoolExecutor(len(fronts)) as pool:
        jobs = [
            pool.submit(
                corruption_campaign,
                frontend,
                rounds,
                work,
                random.Random(_SEED.value * 1000 + i),
                max_steps,
                _RUN_TIMEOUT.value,
                restarts,
            )
            for i, frontend in enumerate(fronts)
        ]
        results = [job.result() for job in jobs]
    print(" | ".join(CORRUPTION_COLUMNS))
    for r in results:
        print(
            " | ".join(str(r[c]) for c in CORRUPTION_COLUMNS)
            + f" | leftovers={len(r['leftovers'])} | failures={len(r['failed_restarts'])}"
        )
    for r in results:
        for failure in r["failed_restarts"] + r["leftovers"]:
            print(f"{r['frontend']}: {failure}")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(
                {
                    "campaign": "corruption",
                    "mode": _MODE.value,
                    "max_steps": max_steps,
                    "rounds": rounds,
                    "command": " ".join(sys.argv),
                    "results": results,
                },
                f,
                indent=1,
            )


def main(argv):
    del argv
    if _CAMPAIGN.value == "corruption":
        main_corruption()
        return
    if _CAMPAIGN.value == "tier":
        main_tier()
        return
    kills = _KILLS.value if _KILLS.value is not None else (2 if _MODE.value == "short" else 100)
    max_steps = _MAX_STEPS.value or (24 if _MODE.value == "short" else 300)
    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="npu_rec_faults_")
    fronts = _FRONTENDS.value
    rounds = _ROUNDS.value or (1 if _MODE.value == "short" else max(1, kills // 20))
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(len(fronts)) as pool:
        for i, frontend in enumerate(fronts):
            share = kills // len(fronts) + (i < kills % len(fronts))
            jobs.append(
                pool.submit(
                    campaign,
                    frontend,
                    share,
                    rounds,
                    work,
                    random.Random(_SEED.value * 1000 + i),
                    max_steps,
                    _RUN_TIMEOUT.value,
                )
            )
    results = [job.result() for job in jobs]
    cols = [
        "frontend",
        "tables",
        "rounds",
        "kills",
        "full_disk_runs",
        "restarts_checked",
        "resumed_from_newest",
        "versions_compared",
        "corrupt_or_inconsistent",
        "positions_differing",
        "max_difference",
        "seconds",
    ]
    print(" | ".join(cols))
    for r in results:
        print(
            " | ".join(str(r[c]) for c in cols) + f" | leftovers={len(r['leftovers'])}"
            f" | failures={len(r['failed_restarts'])}"
        )
    for r in results:
        for failure in r["failed_restarts"] + r["leftovers"]:
            print(f"{r['frontend']}: {failure}")
    out = {
        "mode": _MODE.value,
        "kills": kills,
        "max_steps": max_steps,
        "rounds": rounds,
        "command": " ".join(sys.argv),
        "results": results,
    }
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    app.run(main)
