"""The live `tf.compat.v1` sessions of each graph, for reads outside `session.run`.

mx_rec's `table.size()` reads the host's key count and needs no session.
npu_rec's tables live in the graph's resources, so a read needs the session
that initialised them: the default session when there is one, else the most
recently created session of the table's graph that is still open.
"""

from __future__ import annotations

import weakref

from tensorflow.python.client import session as _session

from npu_rec import _compat

_SESSIONS: list = []  # weak references, oldest first
_tracked = False


def track() -> None:
    """Records every session created from now on (idempotent)."""
    global _tracked
    if _tracked:
        return
    _tracked = True
    original = _session.BaseSession.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _SESSIONS.append(weakref.ref(self))

    _session.BaseSession.__init__ = __init__


def session_for(graph):
    """The default session, or the newest open session of `graph`; None if none."""
    import tensorflow as tf

    default = tf.compat.v1.get_default_session()
    if default is not None and default.graph is graph:
        return default
    for ref in reversed(_SESSIONS):
        sess = ref()
        if sess is not None and sess.graph is graph and not _compat.session_is_closed(sess):
            return sess
    return None
