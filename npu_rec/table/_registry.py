"""Registry of sparse tables by name: global in eager mode, per graph in graph mode.

Names must be unique among the live tables of one program: a second table of
the same name raises `ValueError`. A `tf.compat.v1` graph has its own
namespace, because an Estimator builds a fresh graph (and calls the model_fn
again, re-creating every table) for each `train`/`evaluate`/`predict` call.

`clear()` forgets every registered table; `npu_rec.shutdown()` calls it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import tensorflow as tf

from npu_rec import _rec_config

_LOCK = threading.Lock()
_EAGER: dict[str, Any] = {}
_PER_GRAPH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _namespace() -> dict[str, Any]:
    """The name -> table dict of the current context (eager or the default graph)."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return _EAGER
        graph = tf.compat.v1.get_default_graph()
    space = _PER_GRAPH.get(graph)
    if space is None:
        space = {}
        _PER_GRAPH[graph] = space
    return space


def register(table: Any) -> None:
    """Registers `table` under `table.name` in the current namespace.

    Raises:
      ValueError: a table of the same name is already registered there.
    """
    with _LOCK:
        space = _namespace()
        if table.name in space:
            raise ValueError(
                f"A sparse table named {table.name!r} already exists. Table names must be "
                "unique: pick another `name`, or call npu_rec.shutdown() to forget the "
                "existing tables."
            )
        space[table.name] = table


def get(name: str) -> Any | None:
    """Returns the table called `name` in the current namespace, or None."""
    with _LOCK:
        return _namespace().get(name)


def tables() -> list[Any]:
    """Returns the tables of the current namespace, in creation order."""
    with _LOCK:
        return list(_namespace().values())


def unregister(name: str) -> None:
    """Forgets the table called `name` in the current namespace (no error if absent)."""
    with _LOCK:
        _namespace().pop(name, None)


def clear() -> None:
    """Forgets every table: the eager registry and the registries of all graphs."""
    with _LOCK:
        _EAGER.clear()
        _PER_GRAPH.clear()


_rec_config.register_shutdown_callback(clear)
