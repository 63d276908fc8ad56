"""Rec SDK's `mx_rec` package on npu_rec (see `npu_rec.compat` and docs/porting.md).

Importing it records each `tf.compat.v1.Session` made afterwards, so that a
table's `size()` and `capacity()` can read a graph's tables without a
session argument, as mx_rec's host-side counts can (`_sessions`).
"""

from npu_rec.compat.mx_rec import _sessions

_sessions.track()
