"""The cold records of tiered tables in a table checkpoint: segment files beside the table file.

A full save of a tiered table (docs/design.md "Tiered tables") keeps its
memory rows in the table file `ckpt-<step>.full.nrc`, as an in-memory table's
rows, and its cold records in a directory that belongs to the version,
`ckpt-<step>.full.cold-<token>/<table>/<shard>/`: each sealed segment file of
the shard's store hard-linked (copied where a link fails, e.g. another
filesystem), the open segment's live records copied (`SegmentStore.snapshot`).
The table file's header names the directory (`cold_dir`) and lists, per table
and shard, the files with their record counts, the record layout and the
store's period; its arrays `cold/<table>/<shard>/<i>` hold each file's
liveness bits (packed). So the table file's atomic write stays the one point
of publication: a directory no table file names belongs to no version (an
interrupted save) and is removed (`remove_unreferenced`).

The records carry their own checksums: `verify` checks every record of every
file a segment at a time (a restore's version check; each file once per
process while it is unchanged), and a damaged or missing file refuses the
version naming the file. A delta save holds its changed records in the table
file, as an in-memory table's.
"""

from __future__ import annotations

import os
import shutil
import uuid

import numpy as np

from npu_rec import _log as logging
from npu_rec._paths import fsync_path
from npu_rec.checkpoint import _file_format
from npu_rec.checkpoint._file_format import CheckpointCorruptedError

MARK = ".cold-"
#: Files verified in this process: (path, inode, size, mtime) -> None (they are immutable).
_VERIFIED: dict[tuple, None] = {}


def _stem(path: str) -> str:
    return path[: -len(".nrc")] if path.endswith(".nrc") else path


def companions(path: str) -> list[str]:
    """The cold directories beside table file `path` (published or not)."""
    folder, stem = os.path.split(_stem(path))
    if not os.path.isdir(folder or "."):
        return []
    return sorted(
        os.path.join(folder, n)
        for n in os.listdir(folder or ".")
        if n.startswith(stem + MARK) and ".tmp-" not in n
    )


def named(path: str) -> str | None:
    """The cold directory table file `path` names (absolute), or None."""
    rel = _file_format.read_meta(path).get("cold_dir")
    return os.path.join(os.path.dirname(path), rel) if rel else None


def remove_unreferenced(path: str) -> list[str]:
    """Removes the cold directories beside `path` that it does not name; returns them.

    Where `path` is missing every one goes; where it is unreadable none does
    (its version is damaged, not abandoned).
    """
    keep = None
    if os.path.exists(path):
        try:
            keep = named(path)
        except (CheckpointCorruptedError, OSError):
            return []
    gone = [d for d in companions(path) if d != keep]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def new_dir(path: str) -> tuple[str, str]:
    """(final, temporary) names of a new cold directory for table file `path`."""
    final = f"{_stem(path)}{MARK}{uuid.uuid4().hex[:12]}"
    return final, f"{final}.tmp-{os.getpid()}"


def stores(table) -> list | None:
    """The `SegmentStore` of each shard of a tiered table, or None."""
    shards = getattr(table, "shards", None) or []  # stand-ins of tables have none
    found = [getattr(getattr(s, "state", None), "store", None) for s in shards]
    return found if found and all(s is not None for s in found) else None


def layout(store) -> dict:
    """A store's record layout, as JSON."""
    d = store.dtype
    return {
        "dim": store.dim,
        "row_dtype": _file_format._dtype_name(d["row"].base),
        "slot_dtype": _file_format._dtype_name(d["slots"].base) if store.slot_names else "float32",
        "slot_names": list(store.slot_names),
        "slot_widths": list(store.slot_widths),
        "record_bytes": d.itemsize,
    }


def layout_dtype(lay: dict) -> np.dtype:
    """The record dtype of a `layout`."""
    from npu_rec.table._tier_store import record_dtype  # noqa: PLC0415  (only tiered files)

    dtype = record_dtype(
        lay["dim"],
        _file_format._dtype(lay["row_dtype"]),
        lay["slot_widths"],
        _file_format._dtype(lay["slot_dtype"]),
    )
    if dtype.itemsize != lay["record_bytes"]:
        raise CheckpointCorruptedError(
            f"A tiered table's record layout {lay} does not give {lay['record_bytes']}-byte "
            "records: the checkpoint was written by another layout version."
        )
    return dtype


def collect(found: dict[str, list], rel_dir: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The header entry and arrays of the manifests the stores made in a save.

    `found`: table name -> its shards' stores (after `snapshot`).
    """
    meta, arrays = {}, {}
    for name, shard_stores in found.items():
        shards = []
        for j, store in enumerate(shard_stores):
            m = store.snapshot_manifest
            if m is None:
                raise RuntimeError(f"Tiered table {name!r}: shard {j} made no snapshot.")
            files = []
            for i, f in enumerate(m["files"]):
                arrays[f"cold/{name}/{j}/{i}"] = np.packbits(f["live"][: f["records"]])
                files.append(
                    {
                        "file": f"{name}/{j}/{f['file']}",
                        "records": int(f["records"]),
                        "live": int(np.count_nonzero(f["live"][: f["records"]])),
                        "linked": bool(f["linked"]),
                    }
                )
            shards.append(
                {
                    "period": int(m["period"]),
                    "files": files,
                    "bytes_copied": int(m["bytes_copied"]),
                }
            )
        meta[name] = {"layout": layout(shard_stores[0]), "shards": shards}
    return meta, arrays


def publish(tmp: str, final: str) -> None:
    """Makes the filled temporary cold directory `tmp` the directory `final` (durably)."""
    for root, dirs, _ in os.walk(tmp, topdown=False):
        for d in dirs:
            fsync_path(os.path.join(root, d))
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(os.path.dirname(final) or ".")


def verify(path: str, meta: dict | None = None) -> None:
    """Checks the cold files table file `path` lists: present, and every record's checksum.

    Raises:
      CheckpointCorruptedError: naming the damaged or missing file.
    """
    from npu_rec.table._tier_store import verify_file  # noqa: PLC0415  (only tiered files)

    if meta is None:
        try:
            meta = _file_format.read_meta(path)
        except CheckpointCorruptedError:  # not a table file's header: it names no cold files
            return
    if not meta.get("cold"):
        return
    folder = os.path.join(os.path.dirname(path), meta.get("cold_dir") or "")
    for name, entry in meta["cold"].items():
        dtype = layout_dtype(entry["layout"])
        for shard in entry["shards"]:
            for f in shard["files"]:
                file = os.path.join(folder, f["file"])
                try:
                    st = os.stat(file)
                except OSError:
                    raise CheckpointCorruptedError(
                        f"Checkpoint file {file!r} (cold records of table {name!r} of "
                        f"{path!r}) is missing."
                    ) from None
                key = (os.path.abspath(file), st.st_ino, st.st_size, st.st_mtime_ns)
                if key in _VERIFIED:
                    continue
                why = verify_file(file, dtype, f["records"])
                if why is not None:
                    raise CheckpointCorruptedError(
                        f"Checkpoint file {file!r} (cold records of table {name!r} of "
                        f"{path!r}) is corrupted ({why}); it was refused."
                    )
                _VERIFIED[key] = None


def table_files(path: str, meta: dict, arrays: dict, name: str) -> dict | None:
    """Table `name`'s cold records in a full save, or None.

    Returns:
      `{"layout", "dtype", "periods": per shard, "files": per shard}`, a
      file being `{"path", "records", "live": bool [records]}`.
    """
    entry = (meta.get("cold") or {}).get(name)
    if entry is None:
        return None
    folder = os.path.join(os.path.dirname(path), meta["cold_dir"])
    per_shard = []
    for j, shard in enumerate(entry["shards"]):
        files = []
        for i, f in enumerate(shard["files"]):
            bits = arrays.get(f"cold/{name}/{j}/{i}")
            if bits is None:
                raise CheckpointCorruptedError(
                    f"Checkpoint file {path!r} lists cold file {f['file']!r} of table {name!r} "
                    "without its liveness bits."
                )
            live = np.unpackbits(bits, count=f["records"]).astype(bool)
            files.append(
                {"path": os.path.join(folder, f["file"]), "records": f["records"], "live": live}
            )
        per_shard.append(files)
    return {
        "layout": entry["layout"],
        "dtype": layout_dtype(entry["layout"]),
        "periods": [int(s["period"]) for s in entry["shards"]],
        "files": per_shard,
    }


def read_rows(cold: dict, gone: np.ndarray) -> dict[str, np.ndarray]:
    """The live records of `table_files`' result as state rows (keys not in sorted `gone`).

    Reads a file at a time; for a restore into an in-memory table, which holds
    every row in memory anyway.
    """
    dtype = cold["dtype"]
    parts = []
    for files in cold["files"]:
        for f in files:
            recs = np.fromfile(f["path"], dtype=dtype, count=f["records"])
            if len(recs) != f["records"]:
                raise CheckpointCorruptedError(f"Checkpoint file {f['path']!r} is truncated.")
            recs = recs[f["live"]]
            if len(gone):
                at = np.minimum(np.searchsorted(gone, recs["key"]), len(gone) - 1)
                recs = recs[gone[at] != recs["key"]]
            parts.append(recs)
    recs = np.concatenate(parts) if parts else np.zeros(0, dtype)
    out = {
        "keys": recs["key"].copy(),
        "values": recs["row"].copy(),
        "counts": recs["count"].copy(),
        "last_seen": recs["last_seen"].copy(),
    }
    at = 0
    lay = cold["layout"]
    for n, w in zip(lay["slot_names"], lay["slot_widths"], strict=True):
        out[f"slot/{n}"] = recs["slots"][:, at : at + w].copy()
        at += w
    return out


def read_keys(cold: dict) -> np.ndarray:
    """int64: the keys of the live records of `table_files`' result (a file at a time)."""
    out = [np.zeros(0, np.int64)]
    for files in cold["files"]:
        for f in files:
            recs = np.memmap(f["path"], dtype=cold["dtype"], mode="r", shape=(f["records"],))
            out.append(np.asarray(recs["key"])[f["live"]])
            del recs
    return np.concatenate(out)


def plan(cold: dict, shard_stores, gone: np.ndarray) -> list[dict] | None:
    """Each store's `restore_from` (what its `load` adopts), or None where layouts differ.

    Files go to the shard holding their keys: with the checkpoint's shard count
    (or one shard) whole files, else every file filtered by key.
    """
    from npu_rec.table._sharded import shard_of_numpy  # noqa: PLC0415  (only tiered files)

    dtype, periods, per_shard = cold["dtype"], cold["periods"], cold["files"]
    mine = shard_stores[0].dtype
    if (
        mine["row"].shape != dtype["row"].shape
        or ("slots" in mine.names) != ("slots" in dtype.names)
        or ("slots" in mine.names and mine["slots"].shape != dtype["slots"].shape)
    ):
        return None
    n = len(shard_stores)
    out = []
    for j in range(n):
        if n == 1:
            files, pick = [f for fs in per_shard for f in fs], None
        elif n == len(per_shard):
            files, pick = per_shard[j], None
        else:
            files = [f for fs in per_shard for f in fs]

            def pick(keys, j=j):
                return shard_of_numpy(keys, n) == j

        out.append(
            {
                "dtype": dtype,
                "period": max(periods, default=0),
                "files": files,
                "gone": gone,
                "mine": pick,
            }
        )
    return out


def note(meta: dict, path: str) -> None:
    """Logs what a save put in its cold directory."""
    for name, entry in (meta.get("cold") or {}).items():
        files = [f for s in entry["shards"] for f in s["files"]]
        logging.info(
            "npu_rec: table %r in %s: %d cold segment files (%d hard-linked), %d bytes copied.",
            name,
            path,
            len(files),
            sum(f["linked"] for f in files),
            sum(s["bytes_copied"] for s in entry["shards"]),
        )
