"""Mutual exclusion of a table's training lookups and evictions in `tf.compat.v1` graphs.

A training lookup reads the key index, admits keys (allocates rows from the
free list, inserts keys) and updates counts; an eviction removes keys and
pushes their rows on the free list. Each is a chain of stateful ops. Inside
`tf.function`, automatic control dependencies run the chains of one table in
program order, and eager code runs them one after the other; a v1 graph has
neither, and TensorFlow runs independent ops in parallel on its inter-op
threads, so two lookups of one table in one step (or a lookup beside an
eviction) interleaved and could hand one row to two keys.

In a v1 graph every table therefore owns a `tf.CriticalSection` (a mutex
resource: `MutexLock` waits without blocking a thread), and each training
lookup and each eviction runs inside it: they may run in either order, never
interleaved (`run_locked`, called through `ShardState.locked` by the table's
backend). Measured cost: one `MutexLock` and one `ConsumeMutexLock` per
lookup (a few microseconds).
"""

from __future__ import annotations

import tensorflow as tf

from npu_rec._compat import keep_out_of_meta_graphs

# TensorFlow keeps its critical sections and their executions (Python objects) in
# these graph collections; a meta-graph export would warn about every item.
for _collection in ("critical_sections", "critical_section_executions"):
    keep_out_of_meta_graphs(_collection)


def make_lock(graph_mode: bool, name: str) -> tf.CriticalSection | None:
    """A critical section for a table created in a v1 graph, else None."""
    return tf.CriticalSection(name=f"{name}_lock") if graph_mode else None


def _in_v1_graph() -> bool:
    return not tf.executing_eagerly() and not tf.compat.v1.get_default_graph().building_function


def run_locked(lock: tf.CriticalSection | None, fn):
    """`fn()`'s tensors, built inside `lock` in a v1 graph (as they are without one)."""
    if lock is None or not _in_v1_graph():
        return fn()
    return lock.execute(fn, exclusive_resource_access=False)
