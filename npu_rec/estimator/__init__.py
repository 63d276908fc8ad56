"""The estimator front end of npu_rec (see docs/)."""

__all__: list[str] = []
