"""Committed checkpoint versions of a directory: every part written first, one record last.

A *version* is one save at one global step. Its *parts* are files relative to
the checkpoint directory: the table file `tables/ckpt-<step>.<full|delta>.nrc`,
the dense state (Estimator: `model.ckpt-<step>.index` and `.data-*`; Keras:
`dense-<step>.npz`) and the data position (`data_position-<step>.json` /
`state-<step>.json`). A front end writes and fsyncs every part, then
`VersionLog.commit` publishes the version by writing one record,
`commits/version-<seq>.json` (temp file, fsync, rename, directory fsync):

    {"seq": 7, "id": "9f2c...", "step": 300, "kind": "delta", "parent": "<id>",
     "origin": "<id>", "parts": {"<path>": {"bytes": n, "sha256": "..."}, ...},
     "state": {...}, "pid": 123, "host": "...", "time": ..., "digest": "<sha256 of the rest>"}

`seq` orders versions by save, not by step; a delta names its parent version
by `id`, so a chain is followed by ids, never guessed from step numbers.
A kill or a failed write before the record leaves no version (only
uncommitted parts, removed by `open_for_training`); a restore takes the newest
committed version whose chain verifies (sizes and SHA-256 of every part) and
falls back to older ones with a warning, or refuses (`fallback=False`).

A directory without `commits/` was written before this protocol ("legacy"):
its versions are derived from the files (a table chain by step plus the dense
state at that step) and verified by their own checksums; `open_for_training`
adopts them (writes their records) before the first new save.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
import time
import uuid
import zipfile

from npu_rec import _log as logging
from npu_rec._paths import fsync_path, write_json_atomic  # re-exported
from npu_rec.checkpoint import _cold
from npu_rec.checkpoint._file_format import CheckpointCorruptedError

COMMITS = "commits"
RETIRED = "retired"
_RECORD = re.compile(r"^version-(\d{12})\.json$")
# Every file a version may own, with its step (group "s").
PART = re.compile(
    r"^(?:model\.ckpt-(?P<s1>\d+)\.(?:index|data-\d+-of-\d+)|dense-(?P<s2>\d+)\.npz"
    r"|state-(?P<s3>\d+)\.json|data_position-(?P<s4>\d+)\.json"
    r"|tables/ckpt-(?P<s5>\d{12})\.(?:full|delta)\.nrc)$"
)
# Temporary files of interrupted writes: ours (`atomic_file`: `<name>.tmp-<pid>`), TF's
# Saver (`model.ckpt-<step>_temp/`), and TF's atomic writers (`tf.io.write_graph`, the
# checkpoint-state file: `<name>.tmp<32 hex digits>`, e.g. `graph.pbtxt.tmp<hex>`).
TEMPORARY = re.compile(
    r"^(?:(?:model\.ckpt-|dense-|state-|data_position-|checkpoint|ckpt-"
    r"|version-).*(?:\.tmp|\.tempstate|_temp)"
    r"|.+\.tmp-\d+$|.+\.tmp[0-9a-f]{32}$)"
)
_CHUNK = 1 << 24


@dataclasses.dataclass(frozen=True)
class Version:
    """One committed (or, in a legacy directory, derived) version."""

    seq: int
    id: str
    step: int
    kind: str
    parent: str | None
    parts: dict
    state: dict = dataclasses.field(default_factory=dict)
    origin: str | None = None
    pid: int | None = None
    legacy: bool = False

    def part(self, prefix: str) -> str | None:
        """The relative path of the part whose file name starts with `prefix`, or None."""
        for path in self.parts:
            if os.path.basename(path).startswith(prefix):
                return path
        return None


def digest_of(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def sealed(payload: dict) -> dict:
    """`payload` with a `sha256` of its canonical JSON (see `unseal`)."""
    return {"format": 2, "payload": payload, "sha256": digest_of(payload)}


def unseal(path: str) -> dict:
    """The payload of a JSON file written with `sealed` (or a legacy plain JSON file).

    Raises:
      CheckpointCorruptedError: unreadable JSON or a checksum mismatch, naming `path`.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointCorruptedError(
            f"Checkpoint file {path!r} is corrupted (not valid JSON: {err})."
        ) from None
    if isinstance(data, dict) and data.get("format") == 2 and "sha256" in data:
        if digest_of(data.get("payload")) != data["sha256"]:
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} is corrupted (SHA-256 checksum mismatch: it was "
                "altered after it was written)."
            )
        return data["payload"]
    return data


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe_part(path: str) -> dict:
    """`{"bytes", "sha256"}` of a written part."""
    return {"bytes": os.path.getsize(path), "sha256": file_sha256(path)}


def check_part(path: str) -> None:
    """Verifies a part that has no recorded digest by its own format."""
    name = os.path.basename(path)
    if name.endswith(".nrc"):
        from npu_rec.checkpoint._file_format import read_file

        _cold.verify(path, read_file(path)[1])
    elif name.endswith(".npz"):
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} is corrupted (not a readable .npz: {err})."
            ) from None
        if bad is not None:
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} is corrupted (CRC mismatch in member {bad!r})."
            )
    elif name.endswith(".json"):
        unseal(path)


class VersionLog:
    """The committed versions of one checkpoint directory.

    Args:
      directory: The checkpoint directory (a model_dir, or a Keras
        `SparseCheckpoint` directory).

    Example:
      >>> log = VersionLog("/tmp/model")
      >>> version, chain = log.select()      # newest restorable version, or (None, [])
    """

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)

    @property
    def legacy(self) -> bool:
        """True for a directory written before commit records (no `commits/`)."""
        return not os.path.isdir(os.path.join(self.directory, COMMITS))

    def path(self, rel: str) -> str:
        return os.path.join(self.directory, rel)

    # ---------------------------------------------------------------- reading
    def versions(self) -> list[Version]:
        """The live versions, oldest save first (legacy: derived from the files)."""
        if self.legacy:
            return legacy_versions(self.directory)
        out = []
        folder = os.path.join(self.directory, COMMITS)
        for name in sorted(os.listdir(folder)):
            if _RECORD.match(name):
                version = self._read_record(os.path.join(folder, name))
                if version is not None:
                    out.append(version)
        return sorted(out, key=lambda v: v.seq)

    def _read_record(self, path: str) -> Version | None:
        try:
            with open(path) as f:
                data = json.load(f)
            digest = data.pop("digest")
            if digest != digest_of(data):
                raise ValueError("SHA-256 checksum mismatch")
            return Version(
                data["seq"],
                data["id"],
                data["step"],
                data["kind"],
                data["parent"],
                data["parts"],
                data.get("state") or {},
                data.get("origin"),
                data.get("pid"),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
            logging.warning(
                "npu_rec: commit record %r is unreadable (%s); the version it "
                "published is skipped.",
                path,
                err,
            )
            return None

    def latest(self) -> Version | None:
        """The newest live version (not verified), or None."""
        found = self.versions()
        return found[-1] if found else None

    def chain(self, version: Version, found: list[Version] | None = None) -> list[Version]:
        """The versions to apply for `version`: its full save, then the deltas to it.

        Raises:
          CheckpointCorruptedError: a parent is missing (the chain is broken).
        """
        by_id = {v.id: v for v in (self.versions() if found is None else found)}
        chain = [version]
        while chain[0].kind == "delta":
            parent = by_id.get(chain[0].parent)
            if parent is None:
                raise CheckpointCorruptedError(
                    f"Version step {chain[0].step} in {self.directory!r} is a delta whose "
                    f"parent version {chain[0].parent!r} is missing: its chain is broken."
                )
            chain.insert(0, parent)
        return chain

    def verify(self, chain: list[Version]) -> None:
        """Checks every part of `chain`: present, recorded size and SHA-256.

        Raises:
          CheckpointCorruptedError: naming the file and what is wrong with it.
        """
        for v in chain:
            for rel in v.parts:
                self.verify_part(v, rel)

    def verify_part(self, version: Version, rel: str) -> None:
        """Checks one part of `version` as `verify` does.

        Raises:
          CheckpointCorruptedError: naming the file and what is wrong with it.
        """
        path = self.path(rel)
        if not os.path.exists(path):
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} of version step {version.step} is missing."
            )
        try:
            if not os.path.isfile(path):
                raise IsADirectoryError(21, "not a regular file")
            if version.legacy:
                check_part(path)
                return
            expected = version.parts[rel]
            size = os.path.getsize(path)
            if size != expected["bytes"]:
                kind = "truncated" if size < expected["bytes"] else "has extra bytes"
                raise CheckpointCorruptedError(
                    f"Checkpoint file {path!r} is corrupted ({kind}: {size} bytes, "
                    f"committed with {expected['bytes']})."
                )
            digest = file_sha256(path)
        except OSError as err:
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} cannot be read ({err.strerror or err})."
            ) from None
        if digest != expected["sha256"]:
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} is corrupted (SHA-256 checksum mismatch "
                "with its commit record)."
            )
        if path.endswith(".nrc"):  # a tiered table's cold segment files, named by the file
            _cold.verify(path)

    def select(
        self, step: int | None = None, fallback: bool = True
    ) -> tuple[Version | None, list[Version]]:
        """The version to restore and its chain, verified.

        Args:
          step: A global step (the newest save at that step), or None for the
            newest version that verifies.
          fallback: With `step=None`, skip damaged versions (one WARNING each,
            naming the file and why) and take the newest older one; False
            raises instead.

        Returns:
          `(version, chain)`, or `(None, [])` when nothing is saved.

        Raises:
          CheckpointCorruptedError: a damaged version and no fallback (or an
            explicit `step` that is damaged, or no version verifies).
          LookupError: `step` names no live version.
        """
        found = self.versions()
        if step is not None:
            matches = [v for v in found if v.step == step]
            if not matches:
                raise LookupError(
                    f"No saved version at step {step} in {self.directory!r}. "
                    f"Existing versions: {sorted({v.step for v in found})}"
                )
            chain = self.chain(matches[-1], found)
            self.verify(chain)
            return matches[-1], chain
        skipped = []
        for version in reversed(found):
            try:
                chain = self.chain(version, found)
                self.verify(chain)
                return version, chain
            except CheckpointCorruptedError as err:
                if not fallback:
                    raise CheckpointCorruptedError(
                        f"{err} The newest version (step {version.step}) cannot be restored "
                        "and falling back to an older version is turned off "
                        "(checkpoint_fallback=False)."
                    ) from None
                skipped.append(version.step)
                logging.warning(
                    "npu_rec: skipping checkpoint version step %d in %s: %s "
                    "Falling back to the newest older complete version.",
                    version.step,
                    self.directory,
                    err,
                )
        if skipped:
            raise CheckpointCorruptedError(
                f"No version in {self.directory!r} can be restored: every one is damaged "
                f"(steps {skipped}, warnings above name the files)."
            )
        return None, []

    # ---------------------------------------------------------------- writing
    def commit(
        self,
        step: int,
        kind: str,
        parts: list[str],
        *,
        parent: str | None = None,
        origin: str | None = None,
        state: dict | None = None,
    ) -> Version:
        """Publishes a version whose `parts` (relative paths) are written and fsynced."""
        found = self.versions() if not self.legacy else []
        seq = found[-1].seq + 1 if found else 1
        record = {
            "seq": seq,
            "id": uuid.uuid4().hex[:16],
            "step": int(step),
            "kind": kind,
            "parent": parent if kind == "delta" else None,
            "origin": origin,
            "parts": {rel: describe_part(self.path(rel)) for rel in parts},
            "state": state or {},
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "time": time.time(),
        }
        record["digest"] = digest_of(record)
        folder = os.path.join(self.directory, COMMITS)
        os.makedirs(folder, exist_ok=True)
        write_json_atomic(os.path.join(folder, f"version-{seq:012d}.json"), record)
        return Version(
            seq,
            record["id"],
            int(step),
            kind,
            record["parent"],
            record["parts"],
            record["state"],
            origin,
            os.getpid(),
        )

    def owned(self) -> set[str]:
        """Relative paths of every part a live version owns."""
        return {rel for v in self.versions() for rel in v.parts}

    def delete(self, versions: list[Version]) -> None:
        """Unpublishes `versions` (records first), then removes their parts."""
        for v in versions:
            os.remove(os.path.join(self.directory, COMMITS, f"version-{v.seq:012d}.json"))
        if versions:
            fsync_path(os.path.join(self.directory, COMMITS))
        keep = self.owned()
        for v in versions:
            for rel in v.parts:
                if rel not in keep and os.path.exists(self.path(rel)):
                    os.remove(self.path(rel))
                if rel not in keep and rel.endswith(".nrc"):
                    _cold.remove_unreferenced(self.path(rel))

    def retire(self, versions: list[Version], reason: str) -> str | None:
        """Moves `versions` (records and parts) aside to `retired/<time>-<seq>/`; returns it."""
        if not versions:
            return None
        dest = os.path.join(
            self.directory, RETIRED, time.strftime("%Y%m%d-%H%M%S") + f"-from-seq-{versions[0].seq}"
        )
        for v in versions:
            moved = [f"{COMMITS}/version-{v.seq:012d}.json", *v.parts]
            moved += [
                os.path.relpath(d, self.directory)
                for rel in v.parts
                if rel.endswith(".nrc")
                for d in _cold.companions(self.path(rel))
            ]
            for rel in moved:
                if os.path.exists(self.path(rel)):
                    os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                    os.replace(self.path(rel), os.path.join(dest, rel))
        logging.warning(
            "npu_rec: %s: versions at steps %s in %s were moved aside to %s.",
            reason,
            [v.step for v in versions],
            self.directory,
            dest,
        )
        return dest

    def retention(self, keep: int | None) -> list[Version]:
        """The versions a limit of `keep` saves would delete (None or 0: none).

        The newest `keep` versions stay restorable: their chains (full save and
        the deltas up to them) are kept; every other version goes, so whole old
        chains are deleted and never a part the kept versions need.
        """
        found = self.versions()
        if not keep or len(found) <= keep:
            return []
        needed: set[str] = set()
        for v in found[-keep:]:
            try:
                needed.update(c.id for c in self.chain(v, found))
            except CheckpointCorruptedError:
                return []  # a broken chain: delete nothing rather than guess
        return [v for v in found if v.id not in needed]


def legacy_versions(directory: str) -> list[Version]:
    """The versions of a directory written before commit records, from its files.

    A step is a version when its dense state exists (with, in a Keras
    directory, its `state-<step>.json`) and, when the directory has table
    files, its table chain too (the newest full save at or before the step and
    the deltas after it): a legacy version is self-contained ("full"), its
    parts are its dense files plus every table file of its chain.
    """
    table_files = {}
    tables = os.path.join(directory, "tables")
    if os.path.isdir(tables):
        for name in os.listdir(tables):
            m = re.match(r"^ckpt-(\d{12})\.(full|delta)\.nrc$", name)
            if m:
                table_files[int(m.group(1))] = (m.group(2), f"tables/{name}")
    dense: dict[int, list[str]] = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        m = PART.match(name)
        if m:
            dense.setdefault(int(next(g for g in m.groups() if g is not None)), []).append(name)
    out: list[Version] = []
    for step in sorted(dense):
        files = dense[step]
        keras = any(f.startswith("dense-") for f in files)
        if not any(f.startswith(("model.ckpt-", "dense-")) for f in files) or (
            keras and not any(f.startswith("state-") for f in files)
        ):
            continue
        if any(f.startswith("model.ckpt-") and f.endswith(".index") for f in files) != any(
            f.startswith("model.ckpt-") and ".data-" in f for f in files
        ):
            continue
        parts = {f: {} for f in files}
        if table_files:
            fulls = [s for s, (kind, _) in table_files.items() if kind == "full" and s <= step]
            if not fulls or step not in table_files:
                continue
            parts.update(
                {rel: {} for s, (_, rel) in sorted(table_files.items()) if max(fulls) <= s <= step}
            )
        out.append(Version(len(out) + 1, f"legacy-{step}", step, "full", None, parts, legacy=True))
    return out


def table_parts(chain: list[Version]) -> list[str]:
    """The table files of `chain`, in the order a restore applies them."""
    return [rel for v in chain for rel in sorted(v.parts) if rel.startswith("tables/")]
