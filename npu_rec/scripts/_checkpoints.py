"""Reading a run's checkpoints without building its model: versions, deltas, table sizes.

A `--model_dir` holds `tables/ckpt-<step>.<full|delta>.nrc` (both front ends),
the dense state of each version (`model.ckpt-<step>.index` for the Estimator,
`dense-<step>.npz` for Keras) and one commit record per version
(`commits/version-<seq>.json`, written last). A version can be restored
(`--restore_model_version=<step>`) once it is committed; a directory written
before commit records is read from its files (`npu_rec.checkpoint.VersionLog`).
"""

from __future__ import annotations

import os
import re

import numpy as np

from npu_rec.checkpoint import TableCheckpointManager, VersionLog, read_file
from npu_rec.checkpoint._versions import table_parts

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
    found = [v for v in log.versions() if version is None or v.step == version]
    if not found:
        return {}
    keys: dict[str, set] = {}
    for rel in table_parts(log.chain(found[-1])):
        arrays, meta = read_file(os.path.join(model_dir, rel))
        for name in meta["tables"]:
            new = arrays.get(f"tables/{name}/keys", np.zeros(0, np.int64))
            if meta["kind"] == "full":
                keys[name] = set(new.tolist())
            else:
                gone = arrays.get(f"tables/{name}/deleted_keys", np.zeros(0, np.int64))
                keys[name] = (keys.get(name, set()) - set(gone.tolist())) | set(new.tolist())
    return {name: len(k) for name, k in sorted(keys.items())}


def describe(model_dir: str) -> dict:
    """Everything `inspect_checkpoint.py` prints, as a dict."""
    versions = []
    for v in table_versions(model_dir):
        arrays, meta = read_file(v.path)
        rows = {
            n: int(arrays[f"tables/{n}/keys"].shape[0])
            for n in meta["tables"]
            if f"tables/{n}/keys" in arrays
        }
        versions.append(
            {
                "step": v.step,
                "kind": v.kind,
                "parent": meta.get("parent"),
                "bytes": os.path.getsize(v.path),
                "rows_in_file": rows,
            }
        )
    tables = {}
    if versions:
        _, meta = read_file(table_versions(model_dir)[-1].path)
        tables = {n: dict(d) for n, d in meta["tables"].items()}
        for n, size in table_sizes(model_dir).items():
            tables.setdefault(n, {})["rows"] = size
    return {
        "model_dir": model_dir,
        "tables": tables,
        "versions": versions,
        "dense_versions": dense_versions(model_dir),
        "restore_model_version": restorable_versions(model_dir),
    }
