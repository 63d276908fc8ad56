"""mx_rec.util.initialize: `init`, the settings object and rank helpers on npu_rec.

npu_rec runs one process: rank 0 of 1. The NPU data channel's helpers
(`clear_channel`, `get_host_pipeline_ops`' ops) have nothing to do.
"""

from __future__ import annotations

import npu_rec
from npu_rec._validation import check_bool

#: mx_rec `init` settings with no CPU meaning: accepted (bool), read back, no effect here.
#: `use_shm_swap` tunes the host/device swap; `use_mpi` says ranks come from MPI (npu_rec
#: runs one process per `init`; its workers come from `npu_rec.launch`).
NPU_ONLY_SETTINGS = ("use_shm_swap", "use_mpi")


def init(**kwargs) -> None:
    """mx_rec's `init`: `npu_rec.init` (same settings; `use_mpi` and other
    multi-process settings are accepted and mean one process).

    `use_shm_swap` (mx_rec's shared-memory host/device swap, a PCIe transfer
    speed-up) is accepted and read back by `ConfigInitializer`; it changes
    nothing on a CPU.

    Raises:
      TypeError: `use_shm_swap` or `use_mpi` is not a bool.
    """
    own = {}
    for name in NPU_ONLY_SETTINGS:
        if name in kwargs:
            own[name] = check_bool(name, kwargs.pop(name))
    npu_rec.init(**kwargs)
    ConfigInitializer._instance = None
    ConfigInitializer.get_instance().__dict__["_own"].update(own)


def terminate_config_initializer() -> None:
    """mx_rec's shutdown: `npu_rec.shutdown()` (safe to call when not initialised)."""
    try:
        npu_rec.shutdown()
    except Exception:  # noqa: BLE001  (not initialised: nothing to shut down)
        pass
    ConfigInitializer._instance = None


def get_rank_id() -> int:
    """0: npu_rec runs one process."""
    return 0


def get_rank_size() -> int:
    """1: npu_rec runs one process."""
    return 1


def get_use_dynamic_expansion() -> bool:
    """`use_dynamic_expansion` of `init` (False before it)."""
    from npu_rec.table._config import global_use_dynamic_expansion

    return global_use_dynamic_expansion()


def set_if_load(if_load: bool) -> None:
    """Records mx_rec's `if_load` flag (read back by `ConfigInitializer.if_load`)."""
    ConfigInitializer.get_instance().if_load = bool(if_load)


def clear_channel(is_train_channel=False) -> None:
    """No-op: there is no NPU data channel."""


def get_initializer(is_training=True):
    """mx_rec's graph-modification iterator initializer: not available on npu_rec.

    Raises:
      ValueError: always (use the dataset iterator's own `initializer`).
    """
    raise ValueError(
        "npu_rec does not modify the graph: initialise the dataset iterator itself "
        f"(iterator.initializer). Received: get_initializer(is_training={is_training!r})"
    )


class _HostPipelineOps:
    """mx_rec's host pipeline ops: only `return_timestamp` has a CPU meaning;
    `clear_channel` is a no-op (there is no NPU data channel)."""

    @staticmethod
    def clear_channel(channel_id=None):
        """No-op: there is no NPU data channel."""
        del channel_id

    @staticmethod
    def return_timestamp(tensor):
        """int64 timestamps (seconds, now) shaped like `tensor`."""
        import tensorflow as tf

        now = tf.cast(tf.timestamp(), tf.int64)
        return tf.fill(tf.shape(tensor), now)


def get_host_pipeline_ops():
    """The host pipeline ops object (`return_timestamp`)."""
    return _HostPipelineOps()


class _TrainParamsConfig:
    """mx_rec's training-parameters view: the data channel ids (train 0, eval 1),
    which the no-op `clear_channel` accepts. The graph-modification mode's iterator
    and batch (`get_initializer`, `get_target_batch`) are refused, as
    `get_initializer` is."""

    @staticmethod
    def get_training_mode_channel_id(is_training=True) -> int:
        return 0 if is_training else 1

    @staticmethod
    def get_initializer(is_training=True):
        return get_initializer(is_training)

    @staticmethod
    def get_target_batch(is_training=True):
        raise ValueError(
            "npu_rec does not modify the graph: read the batch from the dataset iterator "
            f"itself. Received: get_target_batch(is_training={is_training!r})"
        )


class _OptimizerConfig:
    """mx_rec's optimizer registry view: `optimizer_instance` is the hash optimizer made last
    (set by each `create_hash_optimizer`, settable by a program's own one)."""

    def __init__(self):
        self.optimizer_instance = None


class ConfigInitializer:
    """mx_rec's settings singleton: reads npu_rec's `init` settings.

    `get_instance()` returns one object per `init`; reading a setting
    (`use_dynamic_expansion`, `train_steps`, ...) reads `npu_rec.get_config()`;
    mx_rec's own flags (`if_load`, ...) can be set and read back.
    """

    _instance: ConfigInitializer | None = None

    def __init__(self):
        self.__dict__["_own"] = {"if_load": False, "use_shm_swap": False}
        self.__dict__["optimizer_config"] = _OptimizerConfig()
        self.__dict__["host_pipeline_ops"] = _HostPipelineOps()

    @classmethod
    def get_instance(cls) -> ConfigInitializer:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @property
    def rank_id(self) -> int:
        return 0

    @property
    def rank_size(self) -> int:
        return 1

    @property
    def train_params_config(self) -> _TrainParamsConfig:
        """Channel ids per mode (`get_training_mode_channel_id`)."""
        return _TrainParamsConfig()

    @property
    def use_static(self) -> bool:
        """mx_rec's static-shape flag: the opposite of `init`'s `use_dynamic`."""
        return not bool(getattr(npu_rec.get_config(), "use_dynamic", True))

    def __getattr__(self, name):
        own = self.__dict__["_own"]
        if name in own:
            return own[name]
        try:
            config = npu_rec.get_config()
        except Exception as err:  # noqa: BLE001
            raise AttributeError(f"ConfigInitializer has no setting {name!r} before init") from err
        if hasattr(config, name):
            return getattr(config, name)
        raise AttributeError(f"ConfigInitializer has no setting {name!r}")

    def __setattr__(self, name, value):
        self.__dict__["_own"][name] = value
