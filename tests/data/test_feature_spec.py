import numpy as np
import pytest
import tensorflow as tf

from npu_rec.data import (
    FeatureSpec,
    feature_key_salt,
    table_keys,
    table_settings,
    validate_feature_specs,
)


def test_defaults_follow_mx_rec():
    spec = FeatureSpec("user_id")
    assert spec.table_name == "user_id" and spec.index_key == "user_id"
    assert spec.feat_count == 1 and spec.dtype == "int64"
    ts = FeatureSpec("ts", is_timestamp=True)
    assert ts.index_key == "timestamp"
    assert FeatureSpec("a", dtype=tf.int32).dtype == "int32"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(access_threshold=-2), ValueError, r"access_threshold.*\[-1, 2147483647\].*-2"),
        (dict(access_threshold=2**31), ValueError, "access_threshold=2147483648"),
        (dict(access_threshold=True), ValueError, "access_threshold=True"),
        (dict(eviction_threshold=5), ValueError, "eviction_threshold.*requires.*access_threshold"),
        (dict(access_threshold=1, eviction_threshold=-3), ValueError, "eviction_threshold=-3"),
        (dict(feat_count=0), ValueError, "feat_count.*feat_count=0"),
        (dict(batch_size=0), ValueError, "batch_size=0"),
        (dict(dtype="float32"), ValueError, "dtype='float32'"),
        (
            dict(is_timestamp=True, index_key="ts"),
            ValueError,
            "index_key='timestamp'.*index_key='ts'",
        ),
        (
            dict(is_timestamp=True, access_threshold=1),
            ValueError,
            "timestamp spec configures no table",
        ),
    ],
)
def test_invalid_specs_name_argument_rule_and_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        FeatureSpec("f", **kwargs)


def test_thresholds_at_the_limits_are_valid():
    spec = FeatureSpec("f", access_threshold=-1, eviction_threshold=2147483647)
    assert spec.replace(access_threshold=0).access_threshold == 0
    with pytest.raises(TypeError, match="no field"):
        spec.replace(threshold=1)


def test_model_level_rules():
    a = FeatureSpec("a", table_name="t", access_threshold=3)
    b = FeatureSpec("b", table_name="t", eviction_threshold=None)
    ts = FeatureSpec("timestamp", is_timestamp=True)
    assert validate_feature_specs([a, b, ts]) == (a, b, ts)
    with pytest.raises(ValueError, match="at most one timestamp"):
        validate_feature_specs([ts, FeatureSpec("t2", is_timestamp=True)])
    with pytest.raises(ValueError, match="unique.*'a'"):
        validate_feature_specs([a, a])
    with pytest.raises(TypeError, match="FeatureSpec"):
        validate_feature_specs(["a"])


def test_table_settings_come_from_the_specs_of_each_table():
    specs = [
        FeatureSpec("a", table_name="t", access_threshold=3, eviction_threshold=86400),
        FeatureSpec("b", table_name="t"),
        FeatureSpec("c"),
        FeatureSpec("timestamp", is_timestamp=True),
    ]
    assert table_settings(specs) == {
        "t": {"access_threshold": 3, "eviction_threshold": 86400},
        "c": {"access_threshold": None, "eviction_threshold": None},
    }
    clash = specs + [FeatureSpec("d", table_name="t", access_threshold=5)]
    with pytest.raises(ValueError, match="'a' and 'd' share table 't'.*access_threshold.*3 and 5"):
        table_settings(clash)


def test_shared_table_keys_are_distinct_per_feature_unless_shared():
    specs = [FeatureSpec("a", table_name="t"), FeatureSpec("b", table_name="t"), FeatureSpec("c")]
    ids = np.array([1, 2, 3], np.int64)
    keys = table_keys(specs, {"a": ids, "b": ids, "c": ids})
    assert not set(keys["a"].tolist()) & set(keys["b"].tolist())
    np.testing.assert_array_equal(keys["a"], ids ^ np.int64(feature_key_salt("a")))
    np.testing.assert_array_equal(keys["c"], ids)  # a table of its own keeps raw ids
    shared = table_keys(specs, {"a": ids, "b": ids}, share_keys=True)
    np.testing.assert_array_equal(shared["a"], shared["b"])
    tensor_keys = table_keys(specs, {"a": tf.constant(ids)})
    np.testing.assert_array_equal(tensor_keys["a"].numpy(), keys["a"])
    assert feature_key_salt("a") == feature_key_salt("a") != feature_key_salt("b")
