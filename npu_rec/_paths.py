"""Where npu_rec writes: directories made on demand, files replaced atomically.

Directories are refused clearly when a file is in the way. Every file npu_rec
publishes (table checkpoints, version logs, data positions, dense weights) is
written by `atomic_file`: a temporary file next to the target, flushed and
fsynced, renamed over the target, then the directory fsynced, so a crash
leaves either the old file or the new one, never a torn one (the fault
campaign, `benchmarks/fault_campaign.py`, kills runs mid-save to check it).
"""

from __future__ import annotations

import contextlib
import json
import os


def file_in_the_way(path: str) -> str | None:
    """The existing non-directory at `path` or at one of its parents, else None."""
    path = os.path.abspath(os.fspath(path))
    while True:
        if os.path.exists(path):
            return None if os.path.isdir(path) else path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def make_directory(path, argument: str) -> str:
    """Creates the directory `path` (with parents) and returns it.

    Args:
      path: the directory.
      argument: the name the user gave it (`model_dir`), for the error.

    Raises:
      ValueError: `path`, or one of its parents, is an existing file.
    """
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise ValueError(
            f"`{argument}` must be a directory, but {blocker!r} is a file. "
            f"Received: {argument}={os.fspath(path)!r}. Give another path (or "
            "move the file away)."
        )
    os.makedirs(path, exist_ok=True)
    return os.fspath(path)


def fsync_path(path: str) -> None:
    """Flushes a file (e.g. one TF's Saver wrote) or a directory's entries to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w"):
    """Yields a file object whose content replaces `path` atomically when the block ends.

    The content goes to `<path>.tmp-<pid>`, which is flushed and fsynced, renamed
    to `path`, and the directory is fsynced. If the block (or a write) raises, the
    temporary file is removed and `path` is untouched.

    Args:
      path: The file to write.
      mode: "w" (text) or "wb" (bytes).
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def write_json_atomic(path: str, payload: dict) -> None:
    """Writes `payload` as JSON (sorted keys) to `path` with `atomic_file`."""
    with atomic_file(path) as f:
        json.dump(payload, f, sort_keys=True)
