"""Table checkpoints of a multi-worker run, and restoring them on any number of workers.

Each worker saves its own keys with a `TableCheckpointManager` in
`<directory>/worker-<rank>-of-<W>/` (full and delta files as in one process).
`restore_tables` reads the newest group of worker directories (every
worker's chain up to `version`), merges the workers' states per table and
hands the whole state to each table: a `WorkerShardedTable` keeps the keys
its worker owns, a one-process table (sharded or not) takes all of them. So a
checkpoint of N workers restores on M workers or in one process, and one of
one process (`directory` itself holding the files) restores on M workers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from npu_rec.checkpoint import TableCheckpointManager

_WORKER_DIR = re.compile(r"^worker-(\d+)-of-(\d+)$")
_ROW_FIELDS = ("keys", "values", "counts", "last_seen")
_PENDING_FIELDS = ("pending_keys", "pending_counts", "pending_last_seen")


def worker_directory(directory: str, table) -> str:
    """Where this worker's files go: `<directory>/worker-<rank>-of-<W>` (one process: `directory`)."""
    workers = getattr(table, "num_workers", 1)
    if workers == 1:
        return directory
    return os.path.join(directory, f"worker-{table.rank}-of-{workers}")


def save_tables(directory: str, tables: Sequence, step: int, delta: bool = False) -> str:
    """Saves this worker's part of `tables` at `step`; every worker calls it. Returns the file."""
    managers = _managers(directory, tables)
    return managers.save(step, delta=delta)


_MANAGERS: dict[tuple, TableCheckpointManager] = {}


def _managers(directory: str, tables: Sequence) -> TableCheckpointManager:
    """One manager per (directory, tables): it remembers the previous save for deltas."""
    key = (directory, tuple(id(t) for t in tables))
    if key not in _MANAGERS:
        _MANAGERS[key] = TableCheckpointManager(worker_directory(directory, tables[0]), tables)
    return _MANAGERS[key]


def saved_layout(directory: str) -> list[str]:
    """The directories holding the newest save: the workers' of one run, or `directory`."""
    groups: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir(directory):
        m = _WORKER_DIR.match(name)
        if m:
            groups.setdefault(int(m.group(2)), []).append(
                (int(m.group(1)), os.path.join(directory, name))
            )
    if not groups:
        return [directory]
    newest = max(groups, key=lambda n: max(os.path.getmtime(p) for _, p in groups[n]))
    found = sorted(groups[newest])
    if [r for r, _ in found] != list(range(newest)):
        raise FileNotFoundError(
            f"Checkpoint {directory!r} was written by {newest} workers but holds the files of "
            f"workers {[r for r, _ in found]} only: every worker's directory is needed."
        )
    return [p for _, p in found]


class StateCollector:
    """Stands in for a table in `TableCheckpointManager.restore`: keeps the state it is given."""

    def __init__(self, table):
        self.name = table.name
        self._table = table
        self.state = None

    @property
    def slot_names(self) -> list[str]:
        """The table's slots (a tiered save's cold records are read into the state with them)."""
        return self._table.slot_names

    def check_compatible(self, meta, path) -> None:
        self._table.check_compatible(meta, path)

    def write_state(self, st, session=None) -> None:
        self.state = st


def restore_tables(directory: str, tables: Sequence, version: int | None = None) -> int:
    """Restores `tables` from a checkpoint of any number of workers; returns its step.

    Args:
      directory: The checkpoint directory given to `save_tables`.
      tables: This worker's tables (`WorkerShardedTable`s, or one-process tables).
      version: A step; None = the newest step that every worker saved.

    Raises:
      FileNotFoundError: no checkpoint, or a worker's directory is missing.
      ValueError: the workers' newest saves are at different steps and no
        `version` was given.
    """
    dirs = saved_layout(directory)
    if version is None:
        latest = {TableCheckpointManager(d, []).latest_version() for d in dirs}
        if None in latest:
            raise FileNotFoundError(f"No table checkpoint in {directory!r}.")
        version = min(latest)
    states: dict[str, list] = {t.name: [] for t in tables}
    step = None
    for d in dirs:
        collect = [StateCollector(t) for t in tables]
        step = TableCheckpointManager(d, collect).restore(version)
        for c in collect:
            states[c.name].append(c.state)
    for t in tables:
        t.write_state(merge_states(states[t.name]))
    # The tables changed under this run's manager: its next save is full.
    _MANAGERS.pop((directory, tuple(id(t) for t in tables)), None)
    return step


def restore_chains(chains: Sequence[Sequence[str]], tables: Sequence) -> int:
    """Restores `tables` from the table files of several workers' chains; returns the step.

    Args:
      chains: One list of table files (absolute paths: a full save, then its
        deltas in order) per worker that wrote the checkpoint.
      tables: This process's tables; each keeps the keys it owns.

    Raises:
      npu_rec.checkpoint.CheckpointCorruptedError: a damaged file (named).
      ValueError: a broken chain or a missing table.
    """
    states: dict[str, list] = {t.name: [] for t in tables}
    step = None
    for paths in chains:
        collect = [StateCollector(t) for t in tables]
        step = TableCheckpointManager(os.path.dirname(paths[0]), collect).restore_files(paths)
        for c in collect:
            states[c.name].append(c.state)
    for t in tables:
        t.write_state(merge_states(states[t.name]))
    return step


def merge_states(states: list[dict]) -> dict:
    """One table state from the states of disjoint key sets (rows and counters sorted by key)."""
    if len(states) == 1:
        return states[0]
    slots = [k for k in states[0] if k.startswith("slot/")]
    out: dict = {}
    for fields in ([*_ROW_FIELDS, *slots], list(_PENDING_FIELDS), ["deleted_keys"]):
        merged = {f: np.concatenate([s[f] for s in states]) for f in fields}
        order = np.argsort(merged[fields[0]], kind="stable")
        out.update({f: v[order] for f, v in merged.items()})
    out["max_seen"] = np.max([s["max_seen"] for s in states])
    out["ts_feature"] = np.any([s["ts_feature"] for s in states])
    out["opt_step"] = np.max([s["opt_step"] for s in states])
    # The trained fallback (not_admitted="hashed"): every worker saved an equal copy.
    out.update({k: v for k, v in states[0].items() if k.startswith("fallback/")})
    return out
