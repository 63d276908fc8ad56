import importlib

import keras
import pytest
import tensorflow as tf

import npu_rec
from npu_rec import _compat


def test_public_packages_import():
    import npu_rec.estimator
    import npu_rec.keras

    assert isinstance(npu_rec.__version__, str)
    assert isinstance(npu_rec.estimator.__all__, list)
    assert isinstance(npu_rec.keras.__all__, list)


@pytest.mark.parametrize(
    "tf_version, keras_version, found",
    [
        ("2.15.1", "3.3.0", "TensorFlow 2.15.1"),
        ("1.15.0", "3.3.0", "TensorFlow 1.15.0"),
        ("3.0.0", "3.3.0", "TensorFlow 3.0.0"),
        ("2.21.0", "2.15.0", "Keras 2.15.0"),
        ("2.21.0", "4.0.0", "Keras 4.0.0"),
    ],
)
def test_unsupported_versions_raise_helpful_import_error(tf_version, keras_version, found):
    with pytest.raises(ImportError, match=f"Found {found}.*pip install"):
        _compat.check_versions(tf_version, keras_version)


@pytest.mark.parametrize("tf_version", ["2.16.0", "2.21.0", "2.30.1rc0"])
def test_supported_versions_pass(tf_version):
    _compat.check_versions(tf_version, "3.12.0")


def test_import_of_npu_rec_fails_on_old_tensorflow(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.15.0")
    with pytest.raises(ImportError, match="TensorFlow 2.15.0.*2.16"):
        importlib.reload(npu_rec)
    monkeypatch.undo()
    importlib.reload(npu_rec)


def test_import_of_npu_rec_fails_on_keras_2(monkeypatch):
    monkeypatch.setattr(keras, "__version__", "2.15.0")
    with pytest.raises(ImportError, match="Keras 2.15.0.*Keras 3"):
        importlib.reload(npu_rec)
    monkeypatch.undo()
    importlib.reload(npu_rec)
