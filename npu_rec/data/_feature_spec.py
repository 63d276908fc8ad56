"""`FeatureSpec`: mx_rec's description of a sparse feature and the table it maps to.

Rules (mx_rec's):

| field | rule |
| --- | --- |
| `name` | a non-empty string, unique within a model |
| `table_name` | the sparse table looked up; default `name`; tables may be shared |
| `index_key` | the input column; default `name` (`"timestamp"` for the timestamp spec) |
| `access_threshold` | None or an int in [-1, 2147483647]: admission after this many accesses |
| `eviction_threshold` | None or an int in [-1, 2147483647] seconds; needs `access_threshold` |
| `is_timestamp` | at most one per model, with `index_key="timestamp"` and no table settings |
| `batch_size` | None or an int >= 1 |
| `feat_count` | an int >= 1: ids per sample (the padded length of a multi-valued feature) |
| `dtype` | "int64" or "int32" |

Keys of features sharing a table are kept apart by a per-feature salt unless
asked to share (see `feature_key_salt` and `table_keys`).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from npu_rec._validation import check_int

MAX_THRESHOLD = 2147483647
TIMESTAMP_KEY = "timestamp"
_UNSET = object()


def _int_or_none(name, value, low, high=None):
    return check_int(name, value, low, high, optional=True)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """A sparse feature of a model, as in mx_rec (see the module docstring for the rules).

    Args:
      name: the feature's name.
      table_name: the table it is looked up in (default: `name`).
      index_key: the input column holding its ids (default: `name`).
      access_threshold: admit an id into the table after this many accesses
        (-1: admission off; None: not set).
      eviction_threshold: evict ids not seen for this many seconds (needs
        `access_threshold`; -1: eviction off).
      is_timestamp: this spec names the model's timestamp column.
      batch_size: samples per batch, if fixed.
      feat_count: ids per sample.
      dtype: "int64" or "int32", the ids' type.

    Raises:
      ValueError: a field breaks its rule (the message names the field, the rule
        and the value), or `eviction_threshold` is set without `access_threshold`.
      TypeError: `is_timestamp` is not a bool.

    Example:
      >>> user = FeatureSpec("user_id", table_name="user", access_threshold=2)
      >>> ts = FeatureSpec("timestamp", is_timestamp=True)
      >>> validate_feature_specs([user, ts])
    """

    name: str
    table_name: str | None = None
    index_key: str | None = None
    access_threshold: int | None = None
    eviction_threshold: int | None = None
    is_timestamp: bool = False
    batch_size: int | None = None
    feat_count: int = 1
    dtype: str = "int64"

    def __post_init__(self):
        self._validate()

    def _validate(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`name` must be a non-empty string. Received: name={self.name!r}")
        for key in ("table_name", "index_key"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(
                    f"`{key}` must be None or a non-empty string. Received: {key}={value!r}"
                )
        if not isinstance(self.is_timestamp, bool):
            raise TypeError(
                f"`is_timestamp` must be a bool. Received: is_timestamp={self.is_timestamp!r}"
            )
        for key in ("access_threshold", "eviction_threshold"):
            set_(key, _int_or_none(key, getattr(self, key), -1, MAX_THRESHOLD))
        if self.eviction_threshold is not None and self.access_threshold is None:
            raise ValueError(
                "`eviction_threshold` requires `access_threshold`. Received: "
                f"eviction_threshold={self.eviction_threshold}, access_threshold=None "
                f"(feature {self.name!r})"
            )
        set_("batch_size", _int_or_none("batch_size", self.batch_size, 1))
        if self.feat_count is None:
            raise ValueError("`feat_count` must be an integer >= 1. Received: feat_count=None")
        set_("feat_count", _int_or_none("feat_count", self.feat_count, 1))
        dtype = getattr(self.dtype, "name", self.dtype)
        if str(dtype) not in ("int64", "int32"):
            raise ValueError(f"`dtype` must be 'int64' or 'int32'. Received: dtype={self.dtype!r}")
        set_("dtype", str(dtype))
        if self.is_timestamp:
            if self.index_key is None:
                set_("index_key", TIMESTAMP_KEY)
            if self.index_key != TIMESTAMP_KEY:
                raise ValueError(
                    f"A timestamp spec must have index_key={TIMESTAMP_KEY!r}. Received: "
                    f"index_key={self.index_key!r}, is_timestamp=True (feature {self.name!r})"
                )
            if self.access_threshold is not None or self.eviction_threshold is not None:
                raise ValueError(
                    "A timestamp spec configures no table: `access_threshold` and "
                    "`eviction_threshold` must be None. Received: "
                    f"access_threshold={self.access_threshold}, "
                    f"eviction_threshold={self.eviction_threshold} (feature {self.name!r})"
                )
        else:
            if self.table_name is None:
                set_("table_name", self.name)
            if self.index_key is None:
                set_("index_key", self.name)

    def replace(self, **kwargs) -> FeatureSpec:
        """A copy with some fields changed (re-validated); unknown fields raise TypeError."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise TypeError(
                f"FeatureSpec has no field(s) {unknown}; its fields are {sorted(fields)}"
            )
        return dataclasses.replace(self, **kwargs)


def validate_feature_specs(specs) -> tuple[FeatureSpec, ...]:
    """Checks a model's specs together: unique names, one timestamp, consistent tables.

    Returns:
      The specs as a tuple.

    Raises:
      TypeError: an element is not a `FeatureSpec`.
      ValueError: duplicate names, more than one timestamp spec, or a shared
        table with conflicting thresholds (names both features).
    """
    specs = tuple(specs)
    for s in specs:
        if not isinstance(s, FeatureSpec):
            raise TypeError(f"`specs` must hold FeatureSpec objects. Received: {s!r}")
    seen = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"Feature names must be unique. Received: name={s.name!r} twice")
        seen.add(s.name)
    stamps = [s.name for s in specs if s.is_timestamp]
    if len(stamps) > 1:
        raise ValueError(
            f"A model may have at most one timestamp spec (is_timestamp=True). Received: {stamps}"
        )
    table_settings(specs)
    return specs


def table_settings(specs) -> dict[str, dict]:
    """Per-table admission/eviction settings derived from the specs that map to each table.

    A threshold set (not None) on any feature of a table configures the
    table; features of a shared table must not set different values.

    Returns:
      `{table_name: {"access_threshold": int | None, "eviction_threshold": int | None}}`
      for every table, in order of first appearance (timestamp specs excluded).

    Raises:
      ValueError: two features of one table set different thresholds (names
        both features, the table and the values).
    """
    out, owner = {}, {}
    for s in specs:
        if s.is_timestamp:
            continue
        settings = out.setdefault(
            s.table_name, {"access_threshold": None, "eviction_threshold": None}
        )
        for key in ("access_threshold", "eviction_threshold"):
            value = getattr(s, key)
            if value is None:
                continue
            if settings[key] is not None and settings[key] != value:
                other = owner[(s.table_name, key)]
                raise ValueError(
                    f"Features {other!r} and {s.name!r} share table {s.table_name!r} but set "
                    f"different `{key}`: {settings[key]} and {value}"
                )
            settings[key] = value
            owner[(s.table_name, key)] = s.name
    return out


def feature_key_salt(name: str) -> int:
    """The salt of a feature's keys: the first 8 bytes of BLAKE2b(name), as an int64."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int(np.frombuffer(digest, "<i8")[0])


def table_keys(specs, features: dict, *, share_keys: bool = False) -> dict:
    """The keys each feature looks up in its table: ids, salted when a table is shared.

    When two or more specs map to one table (and `share_keys` is False), each
    feature's ids are XORed with `feature_key_salt(spec.name)`, so equal raw
    ids of different features are different keys. A table used by one feature,
    or `share_keys=True`, keeps the raw ids.

    Args:
      specs: the model's `FeatureSpec`s.
      features: index_key -> int64 ids (NumPy array or tensor of any shape).
      share_keys: let the features of a shared table share keys.

    Returns:
      spec name -> int64 keys, for every non-timestamp spec whose index_key is present.
    """
    specs = validate_feature_specs(specs)
    users = {}
    for s in specs:
        if not s.is_timestamp:
            users.setdefault(s.table_name, []).append(s.name)
    out = {}
    for s in specs:
        if s.is_timestamp or s.index_key not in features:
            continue
        ids = features[s.index_key]
        if share_keys or len(users[s.table_name]) == 1:
            out[s.name] = ids
        elif isinstance(ids, np.ndarray):
            out[s.name] = ids.astype(np.int64) ^ np.int64(feature_key_salt(s.name))
        else:
            import tensorflow as tf

            salt = tf.constant(feature_key_salt(s.name), tf.int64)
            out[s.name] = tf.bitwise.bitwise_xor(tf.cast(ids, tf.int64), salt)
    return out
