"""The validated settings of one sparse table (`TableConfig`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from npu_rec._validation import ConfigError, ConfigTypeError, check_bool, check_int
from npu_rec.table import _fallback
from npu_rec.table._rounding import check_value_dtype

#: Rows allocated up front by a table with dynamic expansion and no `capacity`.
DEFAULT_DYNAMIC_CAPACITY = 1024
#: Rows of a fixed-size table created without `capacity`.
DEFAULT_FIXED_CAPACITY = 1 << 16
#: Bound on the not-yet-admitted keys whose sightings a table counts.
DEFAULT_MAX_PENDING_KEYS = 1 << 20


def global_use_dynamic_expansion() -> bool:
    """`use_dynamic_expansion` of `npu_rec.init`, or False before that module exists.

    The single place the table core reads the framework settings, so that it
    keeps working while the config module is absent or not initialised.
    """
    try:
        from npu_rec._rec_config import get_config
    except ImportError:
        return False
    try:
        return bool(getattr(get_config(), "use_dynamic_expansion", False))
    except Exception:  # not initialised: use the default
        return False


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """Settings of one `SparseTable`; validated on construction.

    Attributes:
      name: Unique table name (non-empty, no "/").
      dim: Embedding width, >= 1.
      key_dtype: `tf.int64` or `tf.int32`.
      initializer: None (keyed uniform(-0.05, 0.05), see `npu_rec.table._keyed_init`),
        a Keras/TF initializer, or a callable `(shape, dtype) -> tensor`.
      optimizer: An `npu_rec.optimizers.SparseOptimizer` or None (not trainable).
      capacity: Initial rows; the fixed size when dynamic expansion is off.
      access_threshold: Sightings before a key gets a row; -1 = admission off.
      eviction_threshold: Idle seconds before a key's row is freed; -1 = off.
      not_admitted: What a key below `access_threshold` reads and trains: "zeros"
        (the zero vector, no update) or "hashed" (row `hash(key) mod
        fallback_buckets` of the table's trained fallback, `npu_rec.table._fallback`).
      fallback_buckets: Rows of the fallback (`not_admitted="hashed"`), >= 1.
      dynamic_expansion: Grow storage on demand (doubling).
      max_pending_keys: Bound on the counted not-yet-admitted keys.
      num_shards: Key-hash shards of the table (>= 1).
      value_dtype: Storage dtype of the rows: `tf.float32`, `tf.bfloat16` or
        `tf.float16` (names accepted; stored as the `tf.DType`).
      memory_rows: Tiered table: rows kept in memory (per table; >= 1), or None
        (every row in memory). See `npu_rec.table._tier`.
      ssd_path: Tiered table: the directories of its disk tier (a tuple of
        names; a string is taken as one), or None.
    """

    name: str
    dim: int
    key_dtype: tf.DType = tf.int64
    initializer: Callable[..., Any] | None = None
    optimizer: Any = None
    capacity: int = DEFAULT_FIXED_CAPACITY
    access_threshold: int = -1
    eviction_threshold: int = -1
    not_admitted: str = "zeros"
    fallback_buckets: int = 1 << 20
    dynamic_expansion: bool = False
    max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS
    num_shards: int = 1
    value_dtype: Any = tf.float32
    memory_rows: int | None = None
    ssd_path: Any = None

    def __post_init__(self):
        self._validate()

    def _validate(self) -> None:
        """The table of rules of `create_table`'s arguments (errors: `npu_rec._validation`)."""
        name_rule = "`name` must be a non-empty string without '/'. "
        if not isinstance(self.name, str):
            raise ConfigTypeError(
                f"{name_rule}Received: name={self.name!r} of type {type(self.name).__name__}"
            )
        if not self.name or "/" in self.name:
            raise ConfigError(f"{name_rule}Received: name={self.name!r}")
        ints = (
            ("dim", 1, "an integer >= 1"),
            ("capacity", 1, "an integer >= 1 (or None)"),
            ("access_threshold", -1, "an integer >= -1 (-1 = off)"),
            ("eviction_threshold", -1, "an integer >= -1 (-1 = off)"),
            ("max_pending_keys", 2, "an integer >= 2"),
            ("num_shards", 1, "an integer >= 1"),
        )
        for field, low, rule in ints:  # NumPy integers are stored as int
            value = check_int(field, getattr(self, field), low, None, rule=rule)
            object.__setattr__(self, field, value)
        try:
            key_dtype = tf.as_dtype(self.key_dtype)
        except TypeError:
            key_dtype = None
        if key_dtype not in (tf.int64, tf.int32):
            raise ConfigTypeError(
                f"`key_dtype` must be tf.int64 or tf.int32. Received: key_dtype={self.key_dtype!r}"
            )
        if self.eviction_threshold >= 0 and self.access_threshold < 0:
            raise ConfigError(
                "Eviction needs admission: `eviction_threshold` >= 0 requires "
                "`access_threshold` >= 0 (0 admits every key at once). Received: "
                f"eviction_threshold={self.eviction_threshold}, "
                f"access_threshold={self.access_threshold}"
            )
        check_bool("dynamic_expansion", self.dynamic_expansion, rule="a bool or None")
        _fallback.validate(self)
        object.__setattr__(self, "value_dtype", check_value_dtype(self.value_dtype))
        if self.initializer is not None and not callable(self.initializer):
            raise ConfigTypeError(
                "`initializer` must be None, a Keras/TF initializer or a callable "
                f"(shape, dtype) -> tensor. Received: initializer={self.initializer!r}"
            )
        if self.optimizer is not None:
            from npu_rec.optimizers import SparseOptimizer

            if not isinstance(self.optimizer, SparseOptimizer):
                raise ConfigTypeError(
                    "`optimizer` must be an npu_rec.optimizers sparse optimizer "
                    "(SGD, Adagrad, Adam, Ftrl) or None. "
                    f"Received: optimizer={self.optimizer!r}"
                )

        self._validate_tier()

    def _validate_tier(self) -> None:
        """`memory_rows` and `ssd_path` come together (`npu_rec.table._tier`)."""
        if self.memory_rows is None and self.ssd_path is None:
            return
        if self.memory_rows is None or self.ssd_path is None:
            raise ConfigError(
                "A tiered table needs both `memory_rows` and `ssd_path` (or neither). "
                f"Received: memory_rows={self.memory_rows!r}, ssd_path={self.ssd_path!r}"
            )
        rows = check_int("memory_rows", self.memory_rows, 1, None, rule="an integer >= 1 (or None)")
        object.__setattr__(self, "memory_rows", rows)
        from npu_rec.table._tier_store import check_dirs  # noqa: PLC0415

        object.__setattr__(self, "ssd_path", check_dirs(self.ssd_path))

    @property
    def tiered(self) -> bool:
        """True for a table with a disk tier (`memory_rows` and `ssd_path`)."""
        return self.memory_rows is not None

    @property
    def admission(self) -> bool:
        """True when admission counting is on (`access_threshold >= 0`)."""
        return self.access_threshold >= 0

    @property
    def eviction(self) -> bool:
        """True when eviction is on (`eviction_threshold >= 0`)."""
        return self.eviction_threshold >= 0
