"""Reading a run's checkpoints without building its model: versions, deltas, table sizes.

A `--model_dir` holds `tables/ckpt-<step>.<full|delta>.nrc` (both front ends),
the dense state of each version (`model.ckpt-<step>.index` for the Estimator,
`dense-<step>.npz` for Keras) and one commit record per version
(`commits/version-<seq>.json`, written last). A version can be restored
(`--restore_model_version=<step>`) once it is committed; a directory written
before commit records is read from its files (`npu_rec.checkpoint.VersionLog`).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from npu_rec.checkpoint import (
    CheckpointCorruptedError,
    TableCheckpointManager,
    VersionLog,
    _cold,
    read_file,
)
from npu_rec.checkpoint._versions import (
    COMMITS,
    PART,
    RETIRED,
    digest_of,
    table_parts,
)

_RECORD = re.compile(r"^version-\d{12}\.json$")
_DENSE = re.compile(r"^(?:model\.ckpt-(\d+)\.index|dense-(\d+)\.npz)$")


def table_versions(model_dir: str):
    """`CheckpointVersion`s (step, kind, path) of the table checkpoints, by step."""
    tables = os.path.join(model_dir, "tables")
    if not os.path.isdir(tables):
        return []
    return TableCheckpointManager(tables, []).versions()


def dense_versions(model_dir: str) -> list[int]:
    """Steps with a dense checkpoint (Estimator or Keras), sorted."""
    if not os.path.isdir(model_dir):
        return []
    steps = set()
    for name in os.listdir(model_dir):
        m = _DENSE.match(name)
        if m:
            steps.add(int(m.group(1) or m.group(2)))
    return sorted(steps)


def restorable_versions(model_dir: str) -> list[int]:
    """Steps that `--restore_model_version` accepts: the committed versions, by save order."""
    if not os.path.isdir(model_dir):
        return []
    return [v.step for v in VersionLog(model_dir).versions()]


def latest_version(model_dir: str) -> int | None:
    """The step of the newest committed version, or None."""
    steps = restorable_versions(model_dir)
    return steps[-1] if steps else None


def table_sizes(model_dir: str, version: int | None = None) -> dict[str, int]:
    """Rows per table at `version` (default the latest), replaying full + deltas."""
    log = VersionLog(model_dir)
    found = log.versions()
    picked = [v for v in found if version is None or v.step == version]
    if not picked:
        return {}
    return _rows_of_chain(model_dir, log.chain(picked[-1], found))


def table_memory(model_dir: str) -> dict[str, dict | None]:
    """`_memory` of each table as restored from the latest version (empty without one)."""
    log = VersionLog(model_dir)
    found = log.versions()
    if not found:
        return {}
    chain = log.chain(found[-1], found)
    parts = table_parts(chain)
    if not parts:
        return {}
    arrays, _ = read_file(os.path.join(model_dir, parts[-1]))
    return {n: _memory(arrays, n, rows) for n, rows in _rows_of_chain(model_dir, chain).items()}


def _rows_of_chain(model_dir: str, chain) -> dict[str, int]:
    keys: dict[str, set] = {}
    parts = table_parts(chain)
    for rel in parts:
        path = os.path.join(model_dir, rel)
        arrays, meta = read_file(path)
        for name in meta["tables"]:
            new = arrays.get(f"tables/{name}/keys", np.zeros(0, np.int64))
            cold = _cold.table_files(path, meta, arrays, name)
            if cold is not None and len(parts) == 1:  # a tiered full save: its cold keys counted
                live = sum(int(f["live"].sum()) for fs in cold["files"] for f in fs)
                keys[name] = range(len(new) + live)
            elif cold is not None:  # a delta follows: the cold keys read
                keys[name] = set(new.tolist()) | set(_cold.read_keys(cold).tolist())
            elif meta["kind"] == "full":
                keys[name] = set(new.tolist())
            else:
                gone = arrays.get(f"tables/{name}/deleted_keys", np.zeros(0, np.int64))
                keys[name] = (keys.get(name, set()) - set(gone.tolist())) | set(new.tolist())
    return {name: len(k) for name, k in sorted(keys.items())}


def _memory(arrays: dict, name: str, rows: int) -> dict | None:
    """The `memory_stats` of table `name` restored with `rows` rows (from a file's arrays)."""
    from npu_rec.table._stock import restored_memory  # noqa: PLC0415  (TensorFlow)

    values = arrays.get(f"tables/{name}/values")
    if values is None or values.ndim != 2:
        return None
    prefix = f"tables/{name}/slot/"
    widths = [a.shape[1] for k, a in arrays.items() if k.startswith(prefix) and a.ndim == 2]
    stats = restored_memory(rows, values.shape[1], values.dtype.itemsize, widths)
    total = stats["rows"] + stats["slots"] + stats["metadata"] + stats["index"]
    stats["total_bytes"] = total
    stats["bytes_per_live_key"] = round(total / rows, 1) if rows else 0.0
    return stats


def _problem(err: Exception) -> str:
    return str(err) if isinstance(err, CheckpointCorruptedError) else f"{type(err).__name__}: {err}"


def _checked(log: VersionLog, found, cache: dict):
    """version id -> None (its chain verifies) or the first problem (file and reason)."""
    out = {}
    for v in found:
        try:
            chain = log.chain(v, found)
            for link in chain:
                for rel in link.parts:
                    key = (rel, json.dumps(link.parts[rel], sort_keys=True))
                    if key not in cache:
                        try:
                            log.verify_part(link, rel)
                            cache[key] = None
                        except CheckpointCorruptedError as err:
                            cache[key] = str(err)
                    if cache[key] is not None:
                        raise CheckpointCorruptedError(cache[key])
            out[v.id] = None
        except Exception as err:  # any failure: the version cannot be restored
            out[v.id] = _problem(err)
    return out


def _unreadable_records(model_dir: str, log: VersionLog) -> list[dict]:
    """Commit records that cannot be read (the versions they published are skipped)."""
    folder = os.path.join(model_dir, COMMITS)
    if log.legacy or not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        if not _RECORD.match(name):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
            digest = data.pop("digest")
            if digest != digest_of(data):
                raise ValueError("SHA-256 checksum mismatch")
            int(data["seq"]), int(data["step"]), dict(data["parts"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            reason = err.strerror if isinstance(err, OSError) else str(err)
            out.append({"record": f"{COMMITS}/{name}", "problem": f"unreadable ({reason})"})
    return out


def _step_of(rel: str) -> int | None:
    m = PART.match(rel)
    return None if m is None else int(next(g for g in m.groups() if g is not None))


def _uncommitted(model_dir: str, owned: set) -> dict[int, list[str]]:
    """step -> the part files no commit record owns (a lost record or an interrupted save)."""
    out: dict[int, list[str]] = {}
    for sub in ("", "tables"):
        folder = os.path.join(model_dir, sub)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            rel = f"{sub}/{name}" if sub else name
            step = _step_of(rel)
            if step is not None and rel not in owned:
                out.setdefault(step, []).append(rel)
    return out


def _retired(model_dir: str) -> list[dict]:
    """The versions moved aside to `retired/` (by a rollback, a fallback or a lost record)."""
    root = os.path.join(model_dir, RETIRED)
    out = []
    if not os.path.isdir(root):
        return out
    for batch in sorted(os.listdir(root)):
        steps: dict[int, list[str]] = {}
        for folder, _, files in os.walk(os.path.join(root, batch)):
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), os.path.join(root, batch))
                step = _step_of(rel.replace(os.sep, "/"))
                if step is not None:
                    steps.setdefault(step, []).append(rel)
        for step, files in sorted(steps.items()):
            out.append({"step": step, "where": f"{RETIRED}/{batch}", "files": sorted(files)})
    return out


def _bytes(model_dir: str, rels) -> int:
    total = 0
    for rel in rels:
        try:
            total += os.path.getsize(os.path.join(model_dir, rel))
        except OSError:
            pass
    return total


def describe(model_dir: str) -> dict:
    """Everything `inspect_checkpoint.py` prints, as a dict; never raises on damage.

    Every committed version is checked as a restore checks it (its chain: the
    full save and the deltas up to it, every part present with its committed
    size and SHA-256) and listed as "restorable" or "damaged" (with the first
    problem: the file and the reason). Versions moved to `retired/` are listed
    as "retired", part files without a commit record as "uncommitted".
    """
    log = VersionLog(model_dir)
    found = log.versions()
    by_id = {v.id: v for v in found}
    problems = _checked(log, found, {})
    versions = []
    for v in found:
        table = next(iter(table_parts([v])), None)
        parent = by_id.get(v.parent)
        entry = {
            "step": v.step,
            "kind": v.kind,
            "parent": None if v.kind != "delta" else (parent.step if parent else v.parent),
            "bytes": _bytes(model_dir, v.parts),
            "status": "restorable" if problems[v.id] is None else "damaged",
            "files": sorted(v.parts),
        }
        if problems[v.id] is not None:
            entry["problem"] = problems[v.id]
        elif table is not None:
            try:
                arrays, meta = read_file(os.path.join(model_dir, table))
                entry["rows_in_file"] = {
                    n: int(arrays[f"tables/{n}/keys"].shape[0])
                    for n in meta["tables"]
                    if f"tables/{n}/keys" in arrays
                }
            except Exception as err:  # verified a moment ago: changed since
                entry.update(status="damaged", problem=_problem(err))
        versions.append(entry)
    for step, files in sorted(_uncommitted(model_dir, log.owned()).items()):
        versions.append(
            {
                "step": step,
                "kind": None,
                "parent": None,
                "bytes": _bytes(model_dir, files),
                "status": "uncommitted",
                "files": files,
                "problem": "no commit record (deleted, unreadable, or a save that was "
                "interrupted): not restorable; the next training run moves a whole intact "
                "version to retired/ and removes the rest",
            }
        )
    for r in _retired(model_dir):
        versions.append(
            {
                "step": r["step"],
                "kind": None,
                "parent": None,
                "bytes": _bytes(os.path.join(model_dir, r["where"]), r["files"]),
                "status": "retired",
                "files": r["files"],
                "where": r["where"],
            }
        )
    restorable = [e["step"] for e in versions if e["status"] == "restorable"]
    tables: dict[str, dict] = {}
    newest = [v for v in found if problems[v.id] is None]
    if newest:
        try:
            chain = log.chain(newest[-1], found)
            parts = table_parts(chain)
            if parts:
                arrays, meta = read_file(os.path.join(model_dir, parts[-1]))
                tables = {n: dict(d) for n, d in meta["tables"].items()}
                for n, size in _rows_of_chain(model_dir, chain).items():
                    t = tables.setdefault(n, {})
                    t["rows"] = size
                    hot = size
                    if t.get("memory_rows"):  # tiered: a restore keeps the hottest in memory
                        hot = min(size, t["memory_rows"])
                        t["disk_rows"] = size - hot
                    t["memory"] = _memory(arrays, n, hot)
        except Exception as err:  # changed since it was verified
            tables = {"error": {"problem": _problem(err)}}
    return {
        "model_dir": model_dir,
        "tables": tables,
        "versions": versions,
        "damaged": [e for e in versions if e["status"] == "damaged"],
        "commit_records_unreadable": _unreadable_records(model_dir, log),
        "dense_versions": dense_versions(model_dir),
        "restore_model_version": restorable,
    }
