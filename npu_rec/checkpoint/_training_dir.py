"""A checkpoint directory opened for training: locked, cleaned, and the sink of new versions.

`TrainingDir.open()` takes the directory's exclusive training lock
(`npu_rec.lock`: an `fcntl.flock` held while training, with the holder's pid,
host and start time in the file; the kernel frees it when the holder dies, so
a lock left by a dead process is taken over, with a warning naming it),
removes temporary files of interrupted writes, adopts a legacy directory
(writes commit records for the versions its files hold) and removes parts no
committed version owns. `start_from(version)` moves aside the versions saved
after the one training continues from (a rollback, or damaged newer
versions), so a new save never mixes with an abandoned branch.
`commit(...)` publishes a version and applies the retention limit (`keep`):
both front ends use the same object, so retention counts every save in the
directory, across training calls and processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import time

from npu_rec import _log as logging
from npu_rec.checkpoint import _cold
from npu_rec.checkpoint._file_format import CheckpointCorruptedError
from npu_rec.checkpoint._versions import (
    COMMITS,
    PART,
    RETIRED,
    TEMPORARY,
    Version,
    VersionLog,
    check_part,
    describe_part,
    digest_of,
    write_json_atomic,
)

LOCK_FILE = "npu_rec.lock"
# Files only a trainer (holding the lock) writes: their temporary files are never another's.
_CHECKPOINT_FILES = (
    "model.ckpt-",
    "dense-",
    "state-",
    "data_position-",
    "checkpoint",
    "ckpt-",
    "version-",
)


class CheckpointDirLockedError(RuntimeError):
    """Another trainer holds a checkpoint directory's training lock."""


class TrainingLock:
    """The exclusive training lock of `directory` (see the module docstring)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock.

        Raises:
          CheckpointDirLockedError: a live trainer holds it (named: pid, host, since).
        """
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read_holder(fd))
            os.close(fd)
            raise CheckpointDirLockedError(
                f"{os.path.dirname(self.path)!r} is being trained by another process: its lock "
                f"{self.path!r} is held by {holder}. Two trainers on one directory would "
                "interleave their checkpoints; wait for it to finish, stop it, or train in "
                "another directory."
            ) from None
        previous = _read_holder(fd)
        if previous.get("pid") is not None:
            logging.warning(
                "npu_rec: taking over the training lock %s left by %s, which is no longer running.",
                self.path,
                _describe(previous),
            )
        payload = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            }
        ).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, payload, 0)
        os.fsync(fd)
        self._fd = fd

    def __del__(self):
        self.release()

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _written_by_a_live_process(name: str) -> bool:
    """Whether `name` is our temporary file (`<name>.tmp-<pid>`) of a process still running."""
    if name.startswith(_CHECKPOINT_FILES):  # written only under the training lock
        return False
    m = re.search(r"\.tmp-(\d+)$", name)
    if m is None or int(m.group(1)) == os.getpid():
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def _read_holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw.decode()) if raw.strip() else {}
    except (ValueError, OSError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "a process that did not record itself"
    me = " (this process)" if holder.get("pid") == os.getpid() else ""
    return (
        f"pid {holder.get('pid')}{me} on host {holder.get('host')!r} (since {holder.get('since')})"
    )


class TrainingDir:
    """A checkpoint directory while one trainer writes versions into it.

    Args:
      directory: The checkpoint directory.
      keep: Versions kept (`keep_checkpoint_max`; None or 0: all).

    Example:
      >>> tdir = TrainingDir("/tmp/model", keep=5).open()
      >>> version, chain = tdir.log.select()
      >>> tdir.start_from(version)
      >>> ...write the parts of step 100...
      >>> tdir.commit(100, "full", ["tables/ckpt-000000000100.full.nrc", "dense-000000000100.npz"])
      >>> tdir.close()
    """

    def __init__(self, directory: str, keep: int | None = None):
        self.directory = os.fspath(directory)
        self.keep = keep
        self.log = VersionLog(self.directory)
        self.lock = TrainingLock(self.directory)
        #: The id of the version the next delta continues (the last restored or saved).
        self.parent: str | None = None
        self.origin: str | None = None

    def open(self) -> TrainingDir:
        """Locks, removes temporary files, adopts a legacy directory, removes orphans."""
        os.makedirs(self.directory, exist_ok=True)
        self.lock.acquire()
        try:
            self._remove_temporary()
            if self.log.legacy:
                self._adopt()
            self._remove_uncommitted()
        except BaseException:
            self.lock.release()
            raise
        return self

    def close(self) -> None:
        self.lock.release()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- opening
    def _folders(self):
        for rel in ("", "tables", COMMITS):
            folder = os.path.join(self.directory, rel)
            if os.path.isdir(folder):
                yield rel, folder

    def _remove_temporary(self) -> None:
        removed, size = [], 0
        for rel, folder in self._folders():
            for name in os.listdir(folder):
                if not TEMPORARY.match(name) or _written_by_a_live_process(name):
                    continue
                path = os.path.join(folder, name)
                if os.path.isdir(path):
                    size += sum(
                        os.path.getsize(os.path.join(r, f))
                        for r, _, fs in os.walk(path)
                        for f in fs
                    )
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    size += os.path.getsize(path)
                    os.remove(path)
                removed.append(os.path.join(rel, name))
        if removed:
            logging.warning(
                "npu_rec: removed %d temporary files (%d bytes) of interrupted writes in %s: %s",
                len(removed),
                size,
                self.directory,
                sorted(removed)[:10],
            )

    def _adopt(self) -> None:
        """Writes commit records for the versions of a directory written before them."""
        staging = os.path.join(self.directory, COMMITS + ".adopting")
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        seq = 0
        for v in self.log.versions():
            try:
                for rel in v.parts:
                    check_part(self.log.path(rel))
            except (CheckpointCorruptedError, OSError) as err:
                logging.warning(
                    "npu_rec: not adopting version step %d of %s: %s", v.step, self.directory, err
                )
                continue
            seq += 1
            record = {
                "seq": seq,
                "id": v.id,
                "step": v.step,
                "kind": "full",
                "parent": None,
                "origin": None,
                "state": {},
                "pid": None,
                "host": None,
                "time": time.time(),
                "parts": {rel: describe_part(self.log.path(rel)) for rel in v.parts},
            }
            record["digest"] = digest_of(record)
            write_json_atomic(os.path.join(staging, f"version-{seq:012d}.json"), record)
        os.replace(staging, os.path.join(self.directory, COMMITS))
        if seq:
            logging.info(
                "npu_rec: adopted %d versions written before commit records in %s.",
                seq,
                self.directory,
            )

    def _remove_uncommitted(self) -> None:
        """Removes parts no commit record owns; a whole intact version's parts are retired.

        Parts of an interrupted save are removed. The parts of a whole version
        (its dense state, data position where the front end writes one, and its
        table file where the directory has tables) that pass their own checks
        lost their commit record (deleted or unreadable): they are moved to
        `retired/` instead, since a user may still need them.
        """
        owned = self.log.owned()
        orphans: dict[int, list[str]] = {}
        for rel, folder in self._folders():
            if rel == COMMITS:
                continue
            for name in os.listdir(folder):
                path_rel = f"{rel}/{name}" if rel else name
                m = PART.match(path_rel)
                if m and path_rel not in owned:
                    step = int(next(g for g in m.groups() if g is not None))
                    orphans.setdefault(step, []).append(path_rel)
        with_tables = any(rel.startswith("tables/") for rel in owned)
        for step, parts in sorted(orphans.items()):
            if self._intact(parts, with_tables):
                self._retire_parts(step, parts)
                del orphans[step]
        orphans = sorted(rel for parts in orphans.values() for rel in parts)
        for path_rel in orphans:
            os.remove(os.path.join(self.directory, path_rel))
        orphans += self._remove_cold_orphans()
        if orphans:
            logging.warning(
                "npu_rec: removed %d files of uncommitted (interrupted or failed) saves in %s: %s",
                len(orphans),
                self.directory,
                sorted(orphans)[:10],
            )

    def _remove_cold_orphans(self) -> list[str]:
        """Removes tiered tables' cold directories no table file names (interrupted saves)."""
        tables = os.path.join(self.directory, "tables")
        if not os.path.isdir(tables):
            return []
        files = {
            os.path.join(tables, name.split(_cold.MARK)[0] + ".nrc")
            for name in os.listdir(tables)
            if _cold.MARK in name and not TEMPORARY.match(name)
        }
        gone = [d for path in sorted(files) for d in _cold.remove_unreferenced(path)]
        return [os.path.relpath(d, self.directory) + "/" for d in gone]

    def _intact(self, parts: list[str], with_tables: bool) -> bool:
        """Whether `parts` (one step's) are a whole version whose files pass their checks."""
        names = [os.path.basename(rel) for rel in parts]
        keras = any(n.startswith("dense-") for n in names)
        estimator = any(n.endswith(".index") for n in names) and any(".data-" in n for n in names)
        if keras and not any(n.startswith("state-") for n in names):
            return False
        if not (keras or estimator):
            return False
        if with_tables and not any(rel.startswith("tables/") for rel in parts):
            return False
        try:
            for rel in parts:
                check_part(self.log.path(rel))
        except Exception:  # any failure of a file's own check: not intact
            return False
        return True

    def _retire_parts(self, step: int, parts: list[str]) -> None:
        dest = os.path.join(
            self.directory, RETIRED, time.strftime("%Y%m%d-%H%M%S") + f"-uncommitted-step-{step}"
        )
        cold = [
            os.path.relpath(d, self.directory)
            for rel in parts
            if rel.endswith(".nrc")
            for d in _cold.companions(self.log.path(rel))
        ]
        for rel in [*parts, *cold]:
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            os.replace(self.log.path(rel), os.path.join(dest, rel))
        logging.warning(
            "npu_rec: the files of version step %d in %s have no commit record (deleted or "
            "unreadable) but pass their own checks; moved them aside to %s instead of deleting "
            "them: %s",
            step,
            self.directory,
            dest,
            sorted(parts),
        )

    # --------------------------------------------------------------- training
    def start_from(self, version: Version | None, reason: str | None = None) -> None:
        """Training continues from `version` (None: from scratch): newer versions are retired."""
        found = self.log.versions()
        ids = [v.id for v in found]
        if version is None:
            newer = found
        elif version.id in ids:  # found by id: a legacy version is renumbered on adoption
            newer = found[ids.index(version.id) + 1 :]
        else:
            newer = [v for v in found if v.seq > version.seq]
        if newer:
            if reason is None:
                reason = (
                    f"training continues from step {version.step}"
                    if version is not None
                    else "training starts from scratch"
                )
            self.log.retire(newer, reason)
        self.parent = self.origin = None if version is None else version.id

    def commit(self, step: int, kind: str, parts: list[str], state: dict | None = None) -> Version:
        """Publishes a version (its parts written and fsynced), then applies `keep`."""
        version = self.log.commit(
            step, kind, parts, parent=self.parent, origin=self.origin, state=state
        )
        self.parent = version.id
        gone = self.log.retention(self.keep)
        if gone:
            self.log.delete(gone)
            logging.info(
                "npu_rec: keep_checkpoint_max=%d: deleted versions at steps %s in %s.",
                self.keep,
                [v.step for v in gone],
                self.directory,
            )
        return version

    def discard(self, parts: list[str]) -> None:
        """Removes the parts of a save that failed before its commit (best effort)."""
        owned = self.log.owned()
        for rel in parts:
            path = self.log.path(rel)
            if rel not in owned and os.path.exists(path):
                try:
                    os.remove(path)
                except OSError:
                    pass
            if rel not in owned and rel.endswith(".nrc"):
                _cold.remove_unreferenced(path)


__all__ = ["CheckpointDirLockedError", "RETIRED", "TrainingDir", "TrainingLock"]
