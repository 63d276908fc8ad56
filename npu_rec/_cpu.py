"""`bind_cpu`: pin the process and TensorFlow's thread pools to its cores.

Rec SDK binds each device's host process to the CPU cores near that device.
On a CPU host npu_rec does the equivalent: it pins the process to the cores
it may use and sizes TensorFlow's intra-op and inter-op thread pools to match,
so the pools neither oversubscribe the cores nor leave some idle.

When several training processes share a host, each one takes a disjoint,
contiguous share of the available cores if the launcher sets `LOCAL_RANK` and
`LOCAL_WORLD_SIZE` (the torchrun / Horovod-style convention).
"""

from __future__ import annotations

import dataclasses
import os
import threading

from npu_rec import _log as logging

_lock = threading.RLock()
_binding: CpuBinding | None = None
_affinity_before: frozenset[int] | None = None


@dataclasses.dataclass(frozen=True)
class CpuBinding:
    """The result of `bind_cpu=True`.

    Attributes:
      cores: The CPU core ids the process is pinned to, sorted.
      pinned: Whether the OS accepted the affinity (False on platforms without
        `os.sched_setaffinity`).
      tf_threads: Whether TensorFlow's intra/inter-op pools were set to
        `len(cores)`. False when TensorFlow's runtime was already initialised
        with other sizes (it refuses changes then); `message` says so.
      message: A one-line human-readable summary (also logged).
    """

    cores: tuple[int, ...]
    pinned: bool
    tf_threads: bool
    message: str


def plan_cores(
    available: set[int] | frozenset[int],
    local_rank: int | None = None,
    local_size: int | None = None,
) -> tuple[int, ...]:
    """Returns the cores a process should use.

    Args:
      available: The cores the process may run on (`os.sched_getaffinity(0)`).
      local_rank: This process's index among the processes on the host.
      local_size: How many processes share the host.

    Returns:
      All of `available` (sorted) for a single process; otherwise the
      `local_rank`-th of `local_size` contiguous, near-equal shares (every
      process gets at least one core; with more processes than cores they
      share round-robin).
    """
    cores = sorted(available)
    if not cores:
        return ()
    if local_size is None or local_rank is None or local_size <= 1:
        return tuple(cores)
    if not 0 <= local_rank < local_size:
        raise ValueError(
            f"`local_rank` must be in [0, local_size - 1]. Received: "
            f"local_rank={local_rank}, local_size={local_size}"
        )
    if local_size > len(cores):
        return (cores[local_rank % len(cores)],)
    base, extra = divmod(len(cores), local_size)
    start = local_rank * base + min(local_rank, extra)
    stop = start + base + (1 if local_rank < extra else 0)
    return tuple(cores[start:stop])


def _local_rank_from_env() -> tuple[int | None, int | None]:
    rank, size = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
    if rank is None or size is None:
        return None, None
    try:
        rank_i, size_i = int(rank), int(size)
    except ValueError:
        logging.warning(
            "bind_cpu: ignoring non-integer LOCAL_RANK=%r / LOCAL_WORLD_SIZE=%r", rank, size
        )
        return None, None
    if not 0 <= rank_i < size_i:
        logging.warning(
            "bind_cpu: ignoring LOCAL_RANK=%s outside [0, LOCAL_WORLD_SIZE=%s)", rank_i, size_i
        )
        return None, None
    return rank_i, size_i


def _set_tf_threads(n: int) -> str | None:
    """Sizes TF's thread pools to `n`; returns None on success, else the reason."""
    import tensorflow as tf

    threading_api = tf.config.threading
    try:
        threading_api.set_intra_op_parallelism_threads(n)
        threading_api.set_inter_op_parallelism_threads(n)
    except RuntimeError as error:
        return (
            f"TensorFlow's runtime is already initialised (intra-op threads="
            f"{threading_api.get_intra_op_parallelism_threads()}, inter-op threads="
            f"{threading_api.get_inter_op_parallelism_threads()}), so its thread "
            f"pools keep their sizes ({error}). Call npu_rec.init() before running "
            "any TensorFlow op to size them too."
        )
    return None


def bind() -> CpuBinding:
    """Applies `bind_cpu=True` (called by `npu_rec.init`) and returns the result."""
    global _binding, _affinity_before
    with _lock:
        can_pin = hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")
        if can_pin:
            if _affinity_before is None:
                _affinity_before = frozenset(os.sched_getaffinity(0))
            available = _affinity_before
        else:
            available = frozenset(range(os.cpu_count() or 1))
        cores = plan_cores(available, *_local_rank_from_env())
        pinned = False
        if can_pin:
            try:
                os.sched_setaffinity(0, cores)
                pinned = True
            except OSError as error:
                logging.warning("bind_cpu: could not pin to cores %s: %s", cores, error)
        refused = _set_tf_threads(len(cores))
        message = (
            f"npu_rec bind_cpu: process {'pinned' if pinned else 'NOT pinned'} to "
            f"cores {list(cores)}; TensorFlow intra/inter-op threads "
            + (f"= {len(cores)}" if refused is None else f"unchanged: {refused}")
        )
        if refused is None:
            logging.info(message)
        else:
            logging.warning(message)
        _binding = CpuBinding(
            cores=cores, pinned=pinned, tf_threads=refused is None, message=message
        )
        return _binding


def unbind() -> None:
    """Restores the affinity the process had before `bind()` and forgets the binding.

    TensorFlow's thread pools cannot be resized once used, so they are left.
    """
    global _binding, _affinity_before
    with _lock:
        if _affinity_before is not None:
            try:
                os.sched_setaffinity(0, _affinity_before)
            except OSError as error:
                logging.warning(
                    "bind_cpu: could not restore affinity %s: %s", sorted(_affinity_before), error
                )
        _binding = None
        _affinity_before = None


def get_cpu_binding() -> CpuBinding | None:
    """Returns what `bind_cpu=True` did at the last `npu_rec.init`, or None.

    None means `init` was not called, was called with `bind_cpu=False`, or
    `shutdown` was called since.

    Example:
      >>> npu_rec.init(bind_cpu=True)
      >>> npu_rec.get_cpu_binding().cores
      (0, 1)
    """
    with _lock:
        return _binding
