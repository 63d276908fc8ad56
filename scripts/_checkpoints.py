"""Reading a run's checkpoints without building its model: versions, deltas, table sizes.

A `--model_dir` holds `tables/ckpt-<step>.<full|delta>.nrc` (both front ends)
and the dense state of each version: `model.ckpt-<step>.index` (Estimator) or
`dense-<step>.npz` (Keras). A version can be restored
(`--restore_model_version=<step>`) when its table chain (the newest full save
at or before it plus the deltas up to it) and its dense state both exist.
"""

from __future__ import annotations

import os
import re

import numpy as np

from npu_rec.checkpoint import TableCheckpointManager, read_file

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
    """Steps that `--restore_model_version` accepts: a complete table chain and dense state."""
    dense = set(dense_versions(model_dir))
    out, have_full = [], False
    for v in table_versions(model_dir):
        have_full = have_full or v.kind == "full"
        if have_full and v.step in dense:
            out.append(v.step)
    return out


def table_sizes(model_dir: str, version: int | None = None) -> dict[str, int]:
    """Rows per table at `version` (default the latest), replaying full + deltas."""
    found = table_versions(model_dir)
    if version is None and found:
        version = found[-1].step
    fulls = [v for v in found if v.kind == "full" and v.step <= (version or 0)]
    if not fulls:
        return {}
    chain = [fulls[-1]] + [v for v in found
                           if v.kind == "delta" and fulls[-1].step < v.step <= version]
    keys: dict[str, set] = {}
    for v in chain:
        arrays, meta = read_file(v.path)
        for name in meta["tables"]:
            new = arrays.get(f"tables/{name}/keys", np.zeros(0, np.int64))
            if v.kind == "full":
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
        rows = {n: int(arrays[f"tables/{n}/keys"].shape[0]) for n in meta["tables"]
                if f"tables/{n}/keys" in arrays}
        versions.append({"step": v.step, "kind": v.kind, "parent": meta.get("parent"),
                         "bytes": os.path.getsize(v.path), "rows_in_file": rows})
    tables = {}
    if versions:
        _, meta = read_file(table_versions(model_dir)[-1].path)
        tables = {n: dict(d) for n, d in meta["tables"].items()}
        for n, size in table_sizes(model_dir).items():
            tables.setdefault(n, {})["rows"] = size
    return {"model_dir": model_dir, "tables": tables, "versions": versions,
            "dense_versions": dense_versions(model_dir),
            "restore_model_version": restorable_versions(model_dir)}
