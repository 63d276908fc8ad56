"""The table checkpoint file format: atomic, self-describing, checksummed.

Layout of a file:

    b"NPURECT1"                  8-byte magic
    header length                8 bytes, little-endian unsigned
    header                       UTF-8 JSON: {"meta": ..., "arrays": [{name, dtype, shape}]}
                                 (dtype: NumPy's `dtype.str`, or "bfloat16")
    array bytes                  each array C-ordered, in header order
    SHA-256 digest               32 bytes, of everything above

Files are written to `<path>.tmp-<pid>`, flushed, fsynced and renamed over
`path` (`os.replace` is atomic on POSIX), so a crash leaves either the old
file or the new one. A file that is truncated, extended or altered fails the
size or digest check and is refused with `CheckpointCorruptedError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

import numpy as np

from npu_rec._paths import atomic_file, fsync_path  # noqa: F401  (fsync_path re-exported)

MAGIC = b"NPURECT1"
#: Dtypes NumPy spells as raw bytes (bfloat16's `dtype.str` is "<V2"): written by name.
_NAMED = ("bfloat16",)


def _dtype_name(dtype: np.dtype) -> str:
    return dtype.name if dtype.name in _NAMED else dtype.str


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import tensorflow as tf  # noqa: PLC0415  (its NumPy bfloat16; only such files need it)

        return np.dtype(tf.bfloat16.as_numpy_dtype)
    return np.dtype(name)


_DIGEST = 32
_CHUNK = 1 << 24


class CheckpointCorruptedError(ValueError):
    """A checkpoint file is truncated, altered or not a table checkpoint."""


def write_file(path: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Atomically writes `arrays` and JSON-able `meta` to `path`.

    Args:
      path: Destination file.
      arrays: name -> numpy array (any shape, numeric or bool dtype).
      meta: JSON-serialisable metadata.
    """
    arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}
    header = json.dumps(
        {
            "meta": meta,
            "arrays": [
                {"name": k, "dtype": _dtype_name(v.dtype), "shape": list(v.shape)}
                for k, v in arrays.items()
            ],
        },
        sort_keys=True,
    ).encode("utf-8")
    digest = hashlib.sha256()
    with atomic_file(path, "wb") as f:
        for chunk in (MAGIC, struct.pack("<Q", len(header)), header):
            digest.update(chunk)
            f.write(chunk)
        for v in arrays.values():
            view = memoryview(v.reshape(-1).view(np.uint8))
            for start in range(0, len(view), _CHUNK):
                piece = view[start : start + _CHUNK]
                digest.update(piece)
                f.write(piece)
        f.write(digest.digest())


def read_file(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Reads and verifies a file written by `write_file`.

    Returns:
      (arrays, meta).

    Raises:
      CheckpointCorruptedError: bad magic, bad header, wrong size or digest
        mismatch; the message names `path`.
      FileNotFoundError: `path` does not exist.
    """

    def corrupt(reason: str) -> CheckpointCorruptedError:
        return CheckpointCorruptedError(
            f"Checkpoint file {path!r} is corrupted ({reason}); it was refused. Older "
            "versions in the same directory remain usable."
        )

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise corrupt("not an npu_rec table checkpoint: bad magic bytes")
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise corrupt(f"truncated: {size} bytes")
        (hlen,) = struct.unpack("<Q", raw_len)
        if hlen > size:
            raise corrupt(f"truncated: header of {hlen} bytes in a {size}-byte file")
        raw_header = f.read(hlen)
        try:
            header = json.loads(raw_header.decode("utf-8"))
            specs = [(a["name"], _dtype(a["dtype"]), tuple(a["shape"])) for a in header["arrays"]]
        except (ValueError, KeyError, TypeError) as err:
            raise corrupt(f"unreadable header: {err}") from None
        body = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for _, d, s in specs)
        expected = len(MAGIC) + 8 + hlen + body + _DIGEST
        if size != expected:
            kind = "truncated" if size < expected else "has extra bytes"
            raise corrupt(f"{kind}: {size} bytes, expected {expected}")
        digest = hashlib.sha256()
        digest.update(MAGIC + raw_len + raw_header)
        arrays = {}
        for name, dtype, shape in specs:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            buf = bytearray(nbytes)
            view = memoryview(buf)
            got = 0
            while got < nbytes:
                n = f.readinto(view[got : got + _CHUNK])
                if not n:
                    raise corrupt("truncated while reading arrays")
                got += n
            digest.update(buf)
            arrays[name] = np.frombuffer(buf, dtype).reshape(shape)
        if f.read(_DIGEST) != digest.digest():
            raise corrupt("SHA-256 checksum mismatch")
    return arrays, header["meta"]


def read_meta(path: str) -> dict[str, Any]:
    """The `meta` of a file written by `write_file`, from its header alone (not verified).

    Raises:
      CheckpointCorruptedError: not a readable table checkpoint header (naming `path`).
    """
    with open(path, "rb") as f:
        magic, raw_len = f.read(len(MAGIC)), f.read(8)
        try:
            if magic != MAGIC or len(raw_len) != 8:
                raise ValueError("bad magic bytes")
            (hlen,) = struct.unpack("<Q", raw_len)
            return json.loads(f.read(hlen).decode("utf-8"))["meta"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointCorruptedError(
                f"Checkpoint file {path!r} is corrupted (unreadable header: {err})."
            ) from None


def table_arrays(name: str, state: dict[str, Any]) -> dict[str, np.ndarray]:
    """Prefixes a table state's arrays with `tables/<name>/` for a file."""
    return {f"tables/{name}/{k}": np.asarray(v) for k, v in state.items()}


def table_state(name: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state of table `name` from a file's arrays (inverse of `table_arrays`)."""
    prefix = f"tables/{name}/"
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
