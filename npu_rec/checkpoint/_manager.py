"""`TableCheckpointManager`: full and delta checkpoints of a set of sparse tables.

Each save writes one file `ckpt-<step:012d>.<full|delta>.nrc` holding every
managed table (format in `_file_format`). A full save holds every live key
with its row, optimizer slots, count and last-seen time; a delta save holds
only the keys sighted since the previous save of this manager (skipping keys
sighted fewer than `recent_key_count_threshold` times in that period), the
keys deleted (evicted) since then, and, in both kinds, the counters of
not-yet-admitted keys and the table clocks. Every delta names its parent (the
previous save), so a restore can check that its chain is complete.

A tiered table's full save keeps its cold records as segment files in a
directory beside the file, named in the file's header (hard links of the
store's sealed segments: no cold record is rewritten or read; `_cold`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from npu_rec import _log as logging
from npu_rec.checkpoint import _cold, _file_format

_NAME = re.compile(r"^ckpt-(\d{12})\.(full|delta)\.nrc$")
_ROW_FIELDS = ("keys", "values", "counts", "last_seen")


class CheckpointVersion(NamedTuple):
    """One saved version: global `step`, `kind` ("full" or "delta") and file `path`."""

    step: int
    kind: str
    path: str


def _default_threshold() -> int:
    try:
        from npu_rec._rec_config import get_config

        return int(getattr(get_config(), "recent_key_count_threshold", 0) or 0)
    except Exception:  # config module absent or not initialised
        return 0


class TableCheckpointManager:
    """Saves and restores full and delta checkpoints of sparse tables.

    Args:
      directory: Where checkpoint files go (created if missing).
      tables: The `SparseTable`s to manage (names must be unique).
      recent_key_count_threshold: Delta saves skip keys sighted fewer times
        than this since the previous save; None = `npu_rec.init`'s value (0).

    Example:
      >>> manager = npu_rec.checkpoint.TableCheckpointManager("/tmp/ckpt", [table])
      >>> manager.save(100)                 # full
      >>> manager.save(200, delta=True)     # keys changed since step 100
      >>> manager.restore(version=200)      # full@100 + delta@200
    """

    def __init__(self, directory: str, tables: Sequence, recent_key_count_threshold=None):
        if recent_key_count_threshold is None:
            recent_key_count_threshold = _default_threshold()
        if (
            isinstance(recent_key_count_threshold, bool)
            or not isinstance(recent_key_count_threshold, int)
            or recent_key_count_threshold < 0
        ):
            raise ValueError(
                "`recent_key_count_threshold` must be an integer >= 0. Received: "
                f"recent_key_count_threshold={recent_key_count_threshold!r}"
            )
        self.directory = directory
        self.tables = list(tables)
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"`tables` must have unique names. Received: {names}")
        self.recent_key_count_threshold = recent_key_count_threshold
        self._last_step: int | None = None
        os.makedirs(directory, exist_ok=True)

    @property
    def base_step(self) -> int | None:
        """The step a delta save would build on (the last save or restore), or None."""
        return self._last_step

    def versions(self) -> list[CheckpointVersion]:
        """Saved versions in this directory, by increasing step."""
        found = []
        for fname in os.listdir(self.directory):
            m = _NAME.match(fname)
            if m:
                found.append(
                    CheckpointVersion(
                        int(m.group(1)), m.group(2), os.path.join(self.directory, fname)
                    )
                )
        return sorted(found)

    def latest_version(self) -> int | None:
        """The newest saved step, or None when nothing is saved."""
        v = self.versions()
        return v[-1].step if v else None

    def save(self, step: int, delta: bool = False, session=None, commit=None) -> str:
        """Saves every table as of global `step`; returns the file written.

        A delta needs a base: if this manager has not saved or restored yet,
        the save is made full (and logged).

        Args:
          step: Global step (int >= 0), the version's name.
          delta: Delta save (changes since this manager's previous save).
          session: For tables in a tf.compat.v1 graph (see `SparseTable.evict`).
          commit: Called with the file written, before the delta period ends
            (a front end publishes the version there). If it raises, the tables
            keep their period, so the next delta still holds every change since
            the previous published save.

        Raises:
          Whatever reading a table's state raises (e.g. a failed invariant
          check): nothing is written then and the previous version is intact.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"`step` must be an integer >= 0. Received: step={step!r}")
        step = int(step)
        if delta and self._last_step is None:
            logging.info("npu_rec: no previous save or restore; making step %d a full save.", step)
            delta = False
        kind = "delta" if delta else "full"
        min_period = max(1, self.recent_key_count_threshold) if delta else 0
        path = os.path.join(self.directory, f"ckpt-{step:012d}.{kind}.nrc")
        tiered = {} if delta else {t.name: _cold.stores(t) for t in self.tables}
        tiered = {name: found for name, found in tiered.items() if found}
        final = tmp = None
        if tiered:  # the stores put their cold records in a new directory of the version
            final, tmp = _cold.new_dir(path)
            for name, found in tiered.items():
                for j, store in enumerate(found):
                    store.snapshot_to = os.path.join(tmp, name, str(j))
        arrays = {}
        try:
            for t in self.tables:
                arrays.update(_file_format.table_arrays(t.name, t.read_state(min_period, session)))
            meta = {
                "step": step,
                "kind": kind,
                "parent": self._last_step if delta else None,
                "tables": {t.name: t.describe() for t in self.tables},
                "recent_key_count_threshold": self.recent_key_count_threshold,
            }
            if tiered:
                meta["cold"], cold_arrays = _cold.collect(tiered, os.path.basename(final))
                meta["cold_dir"] = os.path.basename(final)
                arrays.update(cold_arrays)
                _cold.publish(tmp, final)
            _file_format.write_file(path, arrays, meta)  # publishes the version (and its folder)
        except BaseException:
            for d in (tmp, final):
                if d is not None:
                    shutil.rmtree(d, ignore_errors=True)
            raise
        finally:
            for found in tiered.values():
                for store in found:
                    store.snapshot_to = store.snapshot_manifest = None
        _cold.remove_unreferenced(path)  # a replaced file's directory
        if tiered:
            _cold.note(meta, path)
        other = os.path.join(self.directory, f"ckpt-{step:012d}.{'full' if delta else 'delta'}.nrc")
        if os.path.exists(other):
            os.remove(other)
        _cold.remove_unreferenced(other)
        if commit is not None:
            commit(path)
        for t in self.tables:
            t.end_period(session)
        self._last_step = step
        return path

    def restore(self, version: int | None = None, session=None) -> int:
        """Restores every table to `version` (default: the latest).

        Loads the newest full save at or before `version`, then the deltas
        after it up to `version`, verifying every file and the delta chain.

        Args:
          version: A global step; None = the latest saved one.
          session: For tables in a tf.compat.v1 graph.

        Returns:
          The step of the last file applied.

        Raises:
          FileNotFoundError: no full save at or before `version`.
          npu_rec.checkpoint.CheckpointCorruptedError: a file of the chain is
            damaged (the message names it); earlier versions still restore.
          ValueError: a broken delta chain, or a table missing from the files.
        """
        found = self.versions()
        if version is None:
            if not found:
                raise FileNotFoundError(f"No table checkpoint in {self.directory!r}.")
            version = found[-1].step
        fulls = [v for v in found if v.kind == "full" and v.step <= version]
        if not fulls:
            raise FileNotFoundError(
                f"No full table checkpoint at or before step {version} in "
                f"{self.directory!r}; versions: {[v.step for v in found]}"
            )
        base = fulls[-1]
        chain = [base] + [v for v in found if v.kind == "delta" and base.step < v.step <= version]
        return self.restore_files([v.path for v in chain], session)

    def restore_files(self, paths: Sequence[str], session=None) -> int:
        """Restores every table from `paths`: a full save, then its deltas in order.

        Returns:
          The step of the last file applied.

        Raises:
          npu_rec.checkpoint.CheckpointCorruptedError: a damaged file (named).
          ValueError: a delta that does not continue the previous file, a
            chain that does not start with a full save, or a missing table.
        """
        states: dict[str, dict] = {}
        cold: dict[str, dict] = {}  # a tiered full save's cold files, per table
        gone: dict[str, list] = {t.name: [] for t in self.tables}  # keys later files replace
        prev = None
        for i, path in enumerate(paths):
            arrays, meta = _file_format.read_file(path)
            kind = meta.get("kind")
            if (kind == "delta") != (i > 0) or (kind == "delta" and meta.get("parent") != prev):
                raise ValueError(
                    f"Checkpoint {path!r} ({kind}, continuing step {meta.get('parent')}) does "
                    f"not continue the previous file of the chain (step {prev}): the chain is "
                    f"broken. Restore version={prev} or an earlier full save."
                )
            if i == 0 and meta.get("cold"):
                _cold.verify(path, meta)
            for t in self.tables:
                t.check_compatible(meta, path)
                st = _file_format.table_state(t.name, arrays)
                if kind == "full":
                    states[t.name] = st
                    found = _cold.table_files(path, meta, arrays, t.name)
                    if found is not None:
                        cold[t.name] = found
                else:
                    states[t.name] = _merge(states[t.name], st)
                    gone[t.name] += [st["deleted_keys"], st["keys"]]
            prev = int(meta["step"])
        for t in self.tables:
            self._write(t, states[t.name], cold.get(t.name), gone[t.name], session)
        self._last_step = prev
        return prev

    @staticmethod
    def _write(table, state: dict, cold, gone: list, session) -> None:
        """Writes `state` into `table`, with the cold files of a tiered full save if any."""
        if cold is None:
            table.write_state(state, session)
            return
        gone = np.unique(np.concatenate([np.zeros(0, np.int64), *gone]).astype(np.int64))
        found = _cold.stores(table)
        plans = _cold.plan(cold, found, gone) if found else None
        if plans is None:  # an in-memory table (or another record layout): rows in memory
            rows = _cold.read_rows(cold, gone)
            fields = [*_ROW_FIELDS, *[f"slot/{n}" for n in table.slot_names]]
            state = dict(state)
            order = np.argsort(np.concatenate([state["keys"], rows["keys"]]), kind="stable")
            for f in fields:
                state[f] = np.concatenate([state[f], rows[f].astype(state[f].dtype)])[order]
            table.write_state(state, session)
            return
        try:
            for store, p in zip(found, plans, strict=True):
                store.restore_from = p
            table.write_state(state, session)
        finally:
            for store in found:
                store.restore_from = None


def _merge(base: dict, delta: dict) -> dict:
    """Applies a delta state (deletions, then upserts) to a full state."""
    row_fields = [*_ROW_FIELDS, *[k for k in base if k.startswith("slot/")]]
    gone = np.concatenate([delta["deleted_keys"], delta["keys"]])
    keep = ~np.isin(base["keys"], gone)
    out = dict(delta)
    for f in row_fields:
        out[f] = np.concatenate([base[f][keep], delta[f]])
    order = np.argsort(out["keys"], kind="stable")
    for f in row_fields:
        out[f] = out[f][order]
    return out
