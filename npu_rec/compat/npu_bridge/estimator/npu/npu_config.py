"""npu_bridge.estimator.npu.npu_config: `NPURunConfig` and friends (npu_rec's)."""

from npu_rec.estimator import ExperimentalConfig, NPURunConfig


class DumpConfig:
    """npu_bridge's operator-dump settings: accepted, nothing is dumped on a CPU."""

    def __init__(
        self, enable_dump=False, dump_path=None, dump_step=None, dump_mode="output", **kwargs
    ):
        self.enable_dump = enable_dump
        self.dump_path = dump_path
        self.dump_step = dump_step
        self.dump_mode = dump_mode


__all__ = ["DumpConfig", "ExperimentalConfig", "NPURunConfig"]
