"""npu_rec: huge sparse recommendation models on TensorFlow 2 and Keras 3.

The Rec SDK (mx_rec) / npu_bridge programming model on standard TensorFlow:
sparse tables keyed by raw 64-bit ids, `npu_rec.init` settings, an Estimator
front end (`npu_rec.estimator`) and a Keras front end (`npu_rec.keras`).
"""

from npu_rec import _compat

_compat.check_installed()

__version__ = "0.1.0"

__all__ = ["__version__"]
