"""mx_rec.util.model_common: the helpers of Rec SDK's session samples (DLRM, DCNv2, MMOE), on npu_rec.

Rec SDK ships this module with mx_rec for its sample models: each sample's
`main_mxrec.py` sets `MODEL_NAME` (and `logger`, `train_steps`,
`eval_steps`) on the module, then takes its `Config`, input pipeline,
session config and evaluation from here. The same names, on a CPU:

* Module settings, read from the environment on import: the 0/1 flags
  `use_dynamic_expansion` (`USE_DYNAMIC_EXPANSION`), `use_multi_lookup`
  (`USE_MULTI_LOOKUP`), `MODIFY_GRAPH_FLAG` (`USE_MODIFY_GRAPH`), `USE_DP`,
  `use_faae` (`USE_FAAE`), `use_shm_swap` (`USE_SHM_SWAP`),
  `huge_tle_enable` (`HUGE_TLB_ENABLE`), and the integers `rank_id`
  (`RANK_ID`), `rank_size` (`TRAIN_RANK_SIZE`), `interval` (`INTERVAL`), or
  None when unset. A flag other than 0 or 1 raises ValueError naming it.
* `Config()`: the sample's hyperparameters for `MODEL_NAME` ("DLRM" or
  "DCNv2"): records of `line_per_sample` samples with 26 sparse and 13
  dense features, `batch_size` samples per batch, tables of `emb_dim`, the
  table sizes of `CACHE_MODE` (`get_emb_table_cfg()`), `send_count`, and
  `learning_rate`, the (dense, sparse) rates of `LearningRateScheduler` at
  `global_step` (a variable the sample increments). `TRAIN_RANK_SIZE` and
  `CACHE_MODE` (HBM, DDR or SSD) must be set; `DLRM_CRITEO_DATA_PATH` holds
  `train/*.tfrecord` and `test/*.tfrecord`. The published sizes are a
  cluster's (8192 samples per batch, 24 million rows per rank): on a CPU
  scale them with `BATCH_SIZE`, `LINE_PER_SAMPLE`, `EMB_DIM` and
  `DEV_VOCAB_SIZE` in the environment (an npu_rec addition), or set the
  attributes after `Config()`.
* `make_batch_and_iterator(cfg, feature_specs, is_training, dump_graph,
  is_use_faae=False)`: the TFRecord pipeline (parse, shuffle when training,
  `train_epoch` / `test_epoch` passes, batches of
  `batch_size // line_per_sample` records reshaped to samples; with
  `is_use_faae` a per-sample `timestamp` of now); returns
  `(batch, initializable iterator)`. `MODEL_NAME = "MMOE"` reads MMOE's
  records (2 labels, 29 sparse and 11 dense features). Rank 0 of 1 reads
  every file.
* `create_feature_spec_list(cfg, use_multi_lookup=None, use_timestamp=False)`:
  the `FeatureSpec`s of the `"sparse_feature"` column in the table
  `"sparse_embeddings"` (twice with multi-lookup; with timestamps,
  admission after 1000 sightings, eviction after 180 s, and the
  `"timestamp"` spec).
* `evaluate(sess, eval_model, eval_iterator, cfg)` and
  `evaluate_fix(step, sess, eval_model, eval_iterator)`: run the evaluation
  input from its start to its end, or for `eval_steps` runs, and return
  `(AUC, mean log loss)` over all its samples; `evaluate_fix` also writes
  the labels and predictions as `interval_<INTERVAL>/numpy_<step>/label_0.npy`
  and `pred_0.npy`. The older forms with a `logger` argument first are
  accepted. The AUC is the rank statistic (ties share their rank); one class
  only raises ValueError.
* `sess_config(...)`: a `ConfigProto` for the CPU session (the NPU
  optimizer's options have no meaning; nothing is dumped);
  `get_npu_run_config()`: an `NPURunConfig` with the samples' cadence.
* `clear_saved_model()`: logs and does nothing. mx_rec deletes NPU logs and
  kernel caches there, which a CPU run does not make.
"""

from __future__ import annotations

import enum
import glob
import os
import random

import numpy as np
import tensorflow as tf

from npu_rec.compat.mx_rec.core.asc.feature_spec import FeatureSpec
from npu_rec.compat.mx_rec.util.initialize import ConfigInitializer, get_host_pipeline_ops
from npu_rec.compat.mx_rec.util.log import logger
from npu_rec.compat.npu_bridge.estimator.npu.npu_config import NPURunConfig

__all__ = [
    "SHUFFLE_SEED",
    "SSD_DATA_PATH",
    "CacheModeEnum",
    "Config",
    "LearningRateScheduler",
    "add_timestamp_func",
    "clear_saved_model",
    "create_feature_spec_list",
    "evaluate",
    "evaluate_fix",
    "get_npu_run_config",
    "make_batch_and_iterator",
    "sess_config",
]

#: The sample this run is (set by the program): "DLRM", "DCNv2" or "MMOE".
MODEL_NAME = None
SSD_DATA_PATH = ["ssd_data"]
SHUFFLE_SEED = 128
random.seed(SHUFFLE_SEED)

train_steps = 0
eval_steps = 0
max_train_steps = 0


def _env_int(name: str):
    text = os.getenv(name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer. Received: {name}={text!r}") from None


def _env_flag(name: str) -> bool:
    text = os.getenv(name, "0")
    if text not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1. Received: {name}={text!r}")
    return text == "1"


rank_id = _env_int("RANK_ID")
rank_size = _env_int("TRAIN_RANK_SIZE")
interval = _env_int("INTERVAL")
use_dynamic_expansion = _env_flag("USE_DYNAMIC_EXPANSION")
use_multi_lookup = _env_flag("USE_MULTI_LOOKUP")
MODIFY_GRAPH_FLAG = _env_flag("USE_MODIFY_GRAPH")
USE_DP = _env_flag("USE_DP")
use_faae = _env_flag("USE_FAAE")
use_shm_swap = _env_flag("USE_SHM_SWAP")
huge_tle_enable = _env_flag("HUGE_TLB_ENABLE")


class CacheModeEnum(enum.Enum):
    """Where a sample keeps its tables: HBM (device), DDR (+ host), SSD (+ disk)."""

    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"


#: The samples' base learning rates (dense, sparse).
_BASE_RATES = (28.443, 33.71193)
#: The samples' schedule in steps of a 65536-sample global batch (warm-up, decay start, decay).
_SCHEDULE = (2750 * 55296 // 65536, 49315 * 55296 // 65536, 27772 * 55296 // 65536)
#: Rows per rank of each cache mode: (device, host, ssd).
_VOCAB = {
    "HBM": (24_000_000, 0, 0),
    "DDR": (500_000, 24_000_000, 0),
    "SSD": (100_000, 2_000_000, 24_000_000),
}


def _sample_name() -> str:
    if MODEL_NAME not in ("DLRM", "DCNv2", "MMOE"):
        raise ValueError(
            "model_common serves the DLRM, DCNv2 and MMOE samples: set "
            "model_common.MODEL_NAME to one of them. Received: "
            f"MODEL_NAME={MODEL_NAME!r}"
        )
    return MODEL_NAME


class LearningRateScheduler:
    """The samples' rate schedule: linear warm-up, constant, then polynomial (power 2) decay.

    At global step `s`, each base rate is multiplied by `s / warmup_steps`
    before `warmup_steps`, by 1 until `decay_start_step`, by
    `((decay_start_step + decay_steps - s) / decay_steps) ** 2` until the
    decay ends, and by `1 / decay_steps` after. The sparse rate of DLRM and
    DCNv2 is clamped to [0, 10].
    """

    def __init__(self, base_lr_dense, base_lr_sparse, warmup_steps, decay_start_step, decay_steps):
        self.base_lr_dense, self.base_lr_sparse = base_lr_dense, base_lr_sparse
        self.warmup_steps = warmup_steps
        self.decay_start_step = decay_start_step
        self.decay_steps = decay_steps
        self.decay_end_step = decay_start_step + decay_steps

    def factor(self, global_step):
        """The multiplier at `global_step` (a float32 tensor)."""
        step = tf.cast(global_step, tf.float32)
        warmup = step / float(self.warmup_steps)
        decay = tf.pow((self.decay_end_step - step) / float(self.decay_steps), 2.0)
        after = tf.constant(1.0 / self.decay_steps, tf.float32)
        late = tf.where(step < self.decay_end_step, decay, after)
        middle = tf.where(step < self.decay_start_step, tf.constant(1.0), late)
        return tf.where(step < self.warmup_steps, warmup, middle)

    def calc(self, global_step):
        """`(dense rate, sparse rate)` at `global_step`, float32 tensors."""
        factor = self.factor(global_step)
        dense = self.base_lr_dense * factor
        sparse = self.base_lr_sparse * factor
        if MODEL_NAME in ("DLRM", "DCNv2"):
            sparse = tf.clip_by_value(sparse, 0.0, 10.0)
        return dense, sparse


class Config:
    """The sample's settings for `MODEL_NAME` (see the module docstring).

    Raises:
      ValueError: `TRAIN_RANK_SIZE` or `CACHE_MODE` unset or invalid, or
        `MODEL_NAME` not "DLRM" / "DCNv2".
    """

    def __init__(self):
        name = _sample_name()
        if name == "MMOE":
            raise ValueError(
                "The MMOE sample takes its Config from its own config.py; model_common's "
                "Config is DLRM's and DCNv2's. Received: MODEL_NAME='MMOE'"
            )
        self.rank_id = _env_int("OMPI_COMM_WORLD_RANK")
        size = _env_int("TRAIN_RANK_SIZE")
        if size is None or size < 1:
            raise ValueError(f"please export TRAIN_RANK_SIZE (>= 1). Received: {size!r}")
        self.rank_size = size
        self.data_path = os.getenv("DLRM_CRITEO_DATA_PATH")
        self.train_file_pattern, self.test_file_pattern = "train", "test"
        self.batch_size = _env_int("BATCH_SIZE") or 8192
        self.line_per_sample = _env_int("LINE_PER_SAMPLE") or 1024
        self.train_epoch, self.test_epoch = 3, 1
        self.perform_shuffle = False
        self.key_type, self.label_type, self.value_type = tf.int64, tf.float32, tf.int64
        self.feat_cnt = self.field_num = 26
        self._set_table_sizes()
        self.send_count = 46000 // self.rank_size
        self.emb_dim = _env_int("EMB_DIM") or 128
        self.hashtable_threshold = 1
        self.USE_PIPELINE_TEST = False
        self.use_lazy_adam_optimizer = False
        self.use_fusion_optim = False
        self.global_step = tf.compat.v1.Variable(0, trainable=False)
        schedule = LearningRateScheduler(*_BASE_RATES, *_SCHEDULE)
        self.learning_rate = schedule.calc(self.global_step)

    def _set_table_sizes(self):
        self.cache_mode = os.getenv("CACHE_MODE")
        if self.cache_mode not in _VOCAB:
            raise ValueError(
                "please export CACHE_MODE as one of HBM, DDR, SSD. Received: "
                f"CACHE_MODE={self.cache_mode!r}"
            )
        device, host, ssd = (n * self.rank_size for n in _VOCAB[self.cache_mode])
        self.dev_vocab_size = _env_int("DEV_VOCAB_SIZE") or device
        self.host_vocab_size = host
        if ssd:
            self.ssd_vocab_size = ssd

    def get_emb_table_cfg(self) -> dict:
        """`create_table`'s size keywords for the cache mode."""
        out = {"device_vocabulary_size": self.dev_vocab_size}
        if self.cache_mode in ("DDR", "SSD"):
            out["host_vocabulary_size"] = self.host_vocab_size
        if self.cache_mode == "SSD":
            out["ssd_vocabulary_size"] = self.ssd_vocab_size
            out["ssd_data_path"] = SSD_DATA_PATH
        return out


def sess_config(dump_data=False, dump_path="./dump_output", dump_steps="0|1|2"):
    """A `ConfigProto` for the CPU session (soft placement); the dump arguments are unused."""
    del dump_data, dump_path, dump_steps
    return tf.compat.v1.ConfigProto(allow_soft_placement=True, log_device_placement=False)


def get_npu_run_config():
    """An `NPURunConfig` with the samples' cadence (checkpoints every 100 steps, 5 kept)."""
    return NPURunConfig(
        save_summary_steps=1000,
        save_checkpoints_steps=100,
        keep_checkpoint_max=5,
        session_config=sess_config(),
        log_step_count_steps=20,
        precision_mode="allow_mix_precision",
        iterations_per_loop=1,
    )


def add_timestamp_func(batch):
    """Adds `batch["timestamp"]`: now, one int64 per label."""
    labels = tf.cast(batch["label"], tf.int64)
    batch["timestamp"] = get_host_pipeline_ops().return_timestamp(labels)
    return batch


def create_feature_spec_list(cfg, use_multi_lookup=None, use_timestamp=False):
    """The `FeatureSpec`s of the samples' one sparse column (see the module docstring)."""
    multi = globals()["use_multi_lookup"] if use_multi_lookup is None else use_multi_lookup
    access, evict = (1000, 180) if use_timestamp else (None, None)

    def spec():
        return FeatureSpec(
            "sparse_feature",
            table_name="sparse_embeddings",
            batch_size=cfg.batch_size,
            access_threshold=access,
            eviction_threshold=evict,
        )

    specs = [spec(), spec()] if multi else [spec()]
    if use_timestamp:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


def clear_saved_model(log=None) -> None:
    """Logs that there is nothing to clear (see the module docstring)."""
    (log or logger).info("model_common: no NPU logs or kernel caches to clear on a CPU.")


def _columns() -> tuple[int, int, int]:
    """(labels, sparse, dense) per sample of the current sample's records."""
    return (2, 29, 11) if _sample_name() == "MMOE" else (1, 26, 13)


def make_batch_and_iterator(config, feature_spec_list, is_training, dump_graph, is_use_faae=False):
    """The sample's TFRecord input: `(batch dict, initializable iterator)`.

    Raises:
      ValueError: no `*.tfrecord` file under the data path's train / test folder.
    """
    del feature_spec_list, dump_graph  # the lookups read the batch itself
    labels, sparse, dense = _columns()
    lines = config.line_per_sample
    spec = {
        "label": tf.io.FixedLenFeature([labels * lines], tf.int64),
        "sparse_feature": tf.io.FixedLenFeature([sparse * lines], tf.int64),
        "dense_feature": tf.io.FixedLenFeature([dense * lines], tf.float32),
    }
    folder = config.train_file_pattern if is_training else config.test_file_pattern
    pattern = os.path.join(config.data_path or "", folder, "*.tfrecord")
    files = sorted(glob.glob(pattern))
    if not files:
        raise ValueError(f"No TFRecord file matches {pattern!r} (DLRM_CRITEO_DATA_PATH).")
    dataset = tf.data.TFRecordDataset(files)
    records = config.batch_size // lines
    if is_training:
        dataset = dataset.shuffle(records * 1000, seed=SHUFFLE_SEED).repeat(config.train_epoch)
    else:
        dataset = dataset.repeat(config.test_epoch)

    def reshape(batch):
        return {
            "label": tf.reshape(batch["label"], [-1, labels]),
            "sparse_feature": tf.reshape(batch["sparse_feature"], [-1, sparse]),
            "dense_feature": tf.reshape(batch["dense_feature"], [-1, dense]),
        }

    dataset = dataset.map(lambda r: tf.io.parse_single_example(r, spec))
    dataset = dataset.batch(records, drop_remainder=True).map(reshape)
    if is_use_faae:
        dataset = dataset.map(add_timestamp_func)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset.prefetch(2))
    return iterator.get_next(), iterator


def _auc(labels, scores) -> float:
    """Area under the ROC curve: the rank statistic, tied scores sharing their mean rank."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        raise ValueError(
            "AUC needs labels of both classes. Received: "
            f"{positives} positive and {negatives} negative labels"
        )
    values, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    del values
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _run_evaluation(sess, eval_model, eval_iterator):
    """Labels, predictions and losses of the evaluation input (to its end or `eval_steps` runs)."""
    if MODIFY_GRAPH_FLAG:
        sess.run(ConfigInitializer.get_instance().train_params_config.get_initializer(False))
    sess.run(eval_iterator.initializer)
    fetches = [eval_model.get("loss"), eval_model.get("pred"), eval_model.get("label")]
    losses, preds, labels, runs = [], [], [], 0
    while not (eval_steps and runs >= eval_steps):
        try:
            loss, pred, label = sess.run(fetches)
        except tf.errors.OutOfRangeError:
            break
        runs += 1
        losses.append(np.asarray(loss).reshape(-1))
        preds.append(np.asarray(pred).reshape(-1))
        labels.append(np.asarray(label).reshape(-1))
    if not runs:
        raise ValueError("The evaluation input is empty: no batch to evaluate.")
    return np.concatenate(labels), np.concatenate(preds), np.concatenate(losses)


def _without_logger(args: tuple, count: int) -> tuple:
    """`args` of the current form (`count` of them), dropping the older form's leading logger."""
    if len(args) == count + 1:
        return args[1:]
    if len(args) != count:
        raise TypeError(f"expected {count} arguments (or a logger and {count}). Received: {args!r}")
    return args


def evaluate(*args):
    """`evaluate(sess, eval_model, eval_iterator, cfg)`: `(AUC, mean log loss)` of the evaluation."""
    sess, eval_model, eval_iterator, _ = _without_logger(args, 4)
    labels, preds, losses = _run_evaluation(sess, eval_model, eval_iterator)
    return _auc(labels, preds), float(np.mean(losses))


def evaluate_fix(step, *args):
    """`evaluate_fix(step, sess, eval_model, eval_iterator)`: `evaluate`, also saving the arrays."""
    sess, eval_model, eval_iterator = _without_logger(args, 3)
    labels, preds, losses = _run_evaluation(sess, eval_model, eval_iterator)
    folder = os.path.join(os.path.abspath("."), f"interval_{interval}", f"numpy_{step}")
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "label_0.npy"), labels)
    np.save(os.path.join(folder, "pred_0.npy"), preds)
    return _auc(labels, preds), float(np.mean(losses))
