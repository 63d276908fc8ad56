"""The absl flags shared by npu_rec's scripts, and their cross-flag rules.

Every script imports this module, so the flags are defined once per process
(tests import several scripts together). Each script adds only flags of its
own, under names no other script uses.
"""

from __future__ import annotations

import difflib
import glob
import math
import os

from absl import flags

from npu_rec._paths import file_in_the_way

#: Step counts are int64 in TensorFlow (global step, checkpoint versions).
MAX_STEP = 2**63 - 1
#: Examples per step: a larger batch of the reference models' features exceeds
#: TensorFlow's 2 GB limit on one tensor in the input pipeline.
MAX_BATCH = 2**20

DATA_NAMES = ("synthetic", "criteo_sample", "avazu_sample", "movielens_sample")
PRECISION_MODES = (
    "force_fp32",
    "must_keep_origin_dtype",
    "allow_fp32_to_fp16",
    "allow_fp32_to_bf16",
    "allow_mix_precision_bf16",
)

FRONTEND = flags.DEFINE_enum(
    "frontend",
    "keras",
    ["keras", "estimator"],
    "Front end: npu_rec.keras RecModel or npu_rec.estimator NPUEstimator.",
)
MODEL = flags.DEFINE_enum("model", "deepfm", ["deepfm", "wdl", "dlrm"], "Reference model.")
DATA = flags.DEFINE_string(
    "data",
    "synthetic",
    f"Training data: one of {', '.join(DATA_NAMES)}, or a file path or glob pattern.",
)
EVAL_DATA = flags.DEFINE_string(
    "eval_data",
    None,
    "Evaluation data path or glob (default: held-out synthetic rows, or "
    "the one row in 10 of --data held out from training).",
)
FORMAT = flags.DEFINE_enum(
    "format",
    None,
    ["csv", "tsv", "criteo", "parquet", "tfrecord"],
    "Format of --data files (default: from the file extension; .txt/.tsv = criteo).",
)
KAFKA = flags.DEFINE_string(
    "kafka",
    None,
    "Train from a Kafka topic instead of --data: the cluster's bootstrap servers "
    "(host:port[,host:port...]). Each message is one comma-separated line: the label, the "
    "dense and the categorical columns in that order (Criteo's label, I1-I13, C1-C26 unless "
    "--dense_features/--categorical_features say otherwise). Needs --topic.",
)
TOPIC = flags.DEFINE_string("topic", None, "The Kafka topic read with --kafka.")
LABEL = flags.DEFINE_string("label", "label", "Label column of --data files.")
DENSE_FEATURES = flags.DEFINE_list(
    "dense_features", None, "Dense columns of --data files (criteo format: I1-I13)."
)
CATEGORICAL_FEATURES = flags.DEFINE_list(
    "categorical_features", None, "Categorical columns of --data files (criteo format: C1-C26)."
)
BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 1024, "Examples per step.", lower_bound=1, upper_bound=MAX_BATCH
)
MAX_STEPS = flags.DEFINE_integer(
    "max_steps",
    300,
    "Global step at which training stops (resumed runs included).",
    lower_bound=1,
    upper_bound=MAX_STEP,
)
EVAL_STEPS = flags.DEFINE_integer(
    "eval_steps", 40, "Evaluation batches.", lower_bound=1, upper_bound=MAX_STEP
)
SAVE_STEPS = flags.DEFINE_integer(
    "save_steps",
    1000,
    "Steps between full checkpoints (npu_rec.init(save_steps)); training's end always saves.",
    lower_bound=1,
    upper_bound=MAX_STEP,
)
MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    None,
    "Checkpoints, TensorBoard events and metrics.json; a run resumes from "
    "the checkpoint it holds. Default: a new temporary directory.",
)
EMBEDDING_DIM = flags.DEFINE_integer(
    "embedding_dim", 8, "Width of the factor embeddings.", lower_bound=2, upper_bound=1024
)
ACCESS_THRESHOLD = flags.DEFINE_integer(
    "access_threshold",
    -1,
    "Admission: an id gets a row after this many sightings (-1 off).",
    lower_bound=-1,
    upper_bound=2147483647,
)
EVICTION_THRESHOLD = flags.DEFINE_integer(
    "eviction_threshold",
    -1,
    "Eviction: free rows of ids unseen this many seconds (-1 off; needs --access_threshold).",
    lower_bound=-1,
    upper_bound=2147483647,
)
NOT_ADMITTED = flags.DEFINE_enum(
    "not_admitted",
    "zeros",
    ["zeros", "hashed"],
    "What an id below --access_threshold reads and trains: the zero vector, or its row of a "
    "small trained fallback table (row hash(id) mod --fallback_buckets; needs "
    "--access_threshold >= 2).",
)
FALLBACK_BUCKETS = flags.DEFINE_integer(
    "fallback_buckets",
    1 << 20,
    "Rows of each table's fallback with --not_admitted=hashed.",
    lower_bound=1,
    upper_bound=2147483647,
)
MEMORY_ROWS = flags.DEFINE_integer(
    "memory_rows",
    None,
    "Tiered tables: rows each sparse table keeps in memory; the others live in files "
    "under --ssd_path (default: every row in memory).",
    lower_bound=1,
)
SSD_PATH = flags.DEFINE_list(
    "ssd_path",
    None,
    "Tiered tables: directories (comma-separated) of the rows beyond --memory_rows.",
)
TABLE_PER_FEATURE = flags.DEFINE_bool(
    "table_per_feature",
    False,
    "One sparse table per categorical feature (default: one "
    "table shared by all, keys salted per feature, as FeatureSpec sharing does).",
)
EVICT_STEPS = flags.DEFINE_integer(
    "evict_steps",
    100,
    "Steps between evictions when --eviction_threshold is set.",
    lower_bound=1,
    upper_bound=MAX_STEP,
)
INCREMENTAL = flags.DEFINE_bool(
    "incremental_checkpoint",
    False,
    "Timed full and delta table checkpoints (npu_rec.init(is_incremental_checkpoint=True)).",
)
FULL_SECS = flags.DEFINE_integer(
    "save_checkpoint_due_time",
    60,
    "Seconds between full saves with --incremental_checkpoint.",
    lower_bound=1,
    upper_bound=2**31 - 1,
)
DELTA_SECS = flags.DEFINE_integer(
    "save_delta_checkpoints_secs",
    10,
    "Seconds between delta saves with --incremental_checkpoint.",
    lower_bound=1,
)
ACCELERATE = flags.DEFINE_string(
    "accelerate_train_mode",
    None,
    'npu_bridge accelerated training, e.g. "fast1|step|0.5" (bfloat16 first, then float32).',
)
PRECISION = flags.DEFINE_enum(
    "precision_mode",
    None,
    list(PRECISION_MODES),
    "npu_bridge precision_mode (Estimator front end).",
)
RESTORE_VERSION = flags.DEFINE_integer(
    "restore_model_version",
    None,
    "Resume from this checkpoint version (a global step) of --model_dir instead of the latest.",
    lower_bound=0,
    upper_bound=MAX_STEP,
)
KEEP = flags.DEFINE_integer(
    "keep_checkpoint_max",
    0,
    "Checkpoint versions kept in --model_dir (0 = all): "
    "NPURunConfig(keep_checkpoint_max) / SparseCheckpoint(keep_checkpoint_max).",
    lower_bound=0,
    upper_bound=2**31 - 1,
)
SEED = flags.DEFINE_integer(
    "seed", 0, "Seeds the data and the model.", lower_bound=0, upper_bound=2**32 - 1
)
LEARNING_RATE = flags.DEFINE_float(
    "learning_rate", 1e-3, "Adam learning rate (dense).", lower_bound=0.0
)
SPARSE_LEARNING_RATE = flags.DEFINE_float(
    "sparse_learning_rate", 0.05, "Learning rate of the tables' sparse optimizer.", lower_bound=0.0
)
SPARSE_OPTIMIZER = flags.DEFINE_enum(
    "sparse_optimizer",
    "adagrad",
    ["adagrad", "rowwise_adagrad", "sgd", "adam", "ftrl"],
    "Sparse optimizer of the tables (npu_rec.optimizers: Adagrad, RowWiseAdagrad with one "
    "accumulator per row, SGD, lazy Adam, Ftrl), at --sparse_learning_rate.",
)
VALUE_DTYPE = flags.DEFINE_enum(
    "value_dtype",
    "float32",
    ["float32", "bfloat16", "float16"],
    "Storage dtype of the table rows (create_table's value_dtype); updates round "
    "stochastically to it.",
)
REPORT = flags.DEFINE_string("report", None, "Write a PNG plot of loss and AUC over steps here.")
VERBOSE = flags.DEFINE_integer(
    "verbose", 1, "0 silent, 1 progress bar and summary.", lower_bound=0, upper_bound=2
)


#: The shared flags by topic, in the order `--help` lists them (tests check that every
#: flag of this module is in exactly one group).
GROUPS = (
    (
        "model",
        (
            "frontend",
            "model",
            "embedding_dim",
            "table_per_feature",
            "seed",
            "learning_rate",
            "sparse_learning_rate",
            "sparse_optimizer",
            "value_dtype",
        ),
    ),
    (
        "data",
        (
            "data",
            "format",
            "label",
            "dense_features",
            "categorical_features",
            "eval_data",
            "kafka",
            "topic",
        ),
    ),
    ("steps", ("batch_size", "max_steps", "eval_steps")),
    (
        "checkpoints",
        (
            "model_dir",
            "restore_model_version",
            "save_steps",
            "incremental_checkpoint",
            "save_checkpoint_due_time",
            "save_delta_checkpoints_secs",
            "keep_checkpoint_max",
        ),
    ),
    (
        "admission and eviction",
        (
            "access_threshold",
            "not_admitted",
            "fallback_buckets",
            "eviction_threshold",
            "evict_steps",
        ),
    ),
    ("disk tier", ("memory_rows", "ssd_path")),
    ("precision", ("accelerate_train_mode", "precision_mode")),
    ("output", ("report", "verbose")),
)


@flags.multi_flags_validator(
    ["eviction_threshold", "access_threshold"],
    message="--eviction_threshold needs --access_threshold >= 0 (mx_rec: eviction requires "
    "admission)",
)
def _eviction_needs_admission(v):
    return v["eviction_threshold"] < 0 or v["access_threshold"] >= 0


@flags.multi_flags_validator(
    ["not_admitted", "access_threshold"],
    message="--not_admitted=hashed needs --access_threshold >= 2 (below that every id gets its "
    "own row at its first sighting, so no id would read the fallback)",
)
def _hashed_needs_admission(v):
    return v["not_admitted"] != "hashed" or v["access_threshold"] >= 2


@flags.multi_flags_validator(
    ["memory_rows", "ssd_path"],
    message="--memory_rows and --ssd_path come together (a tiered table needs both)",
)
def _tier_flags_together(v):
    return (v["memory_rows"] is None) == (not v["ssd_path"])


@flags.validator("ssd_path", message="--ssd_path must name directories, not files")
def _ssd_path_directories(paths):
    return not paths or all(p and file_in_the_way(p) is None for p in paths)


@flags.multi_flags_validator(
    ["restore_model_version", "model_dir"],
    message="--restore_model_version needs --model_dir holding that checkpoint",
)
def _restore_needs_model_dir(v):
    return v["restore_model_version"] is None or bool(v["model_dir"])


@flags.multi_flags_validator(
    ["save_delta_checkpoints_secs", "save_checkpoint_due_time"],
    message="--save_delta_checkpoints_secs must be smaller than --save_checkpoint_due_time "
    "(deltas between full saves)",
)
def _delta_before_full(v):
    return v["save_delta_checkpoints_secs"] < v["save_checkpoint_due_time"]


@flags.validator(
    "accelerate_train_mode",
    message='--accelerate_train_mode must look like "fast|step|0.9" or '
    '"fast1|loss|1.05" (npu_bridge ExperimentalConfig)',
)
def _accelerate_format(value):
    if value is None:
        return True
    from npu_rec.estimator import ExperimentalConfig  # TensorFlow: not for --help

    try:
        ExperimentalConfig(accelerate_train_mode=value)
    except ValueError as e:
        raise flags.ValidationError(f"--accelerate_train_mode={value!r}: {e}") from None
    return True


@flags.multi_flags_validator(
    ["accelerate_train_mode", "frontend", "precision_mode"],
    message="--accelerate_train_mode with --precision_mode: only allow_fp32_to_fp16 or "
    "must_keep_origin_dtype may be combined (npu_bridge's rule)",
)
def _accelerate_precision(v):
    return (
        not v["accelerate_train_mode"]
        or v["precision_mode"] is None
        or v["precision_mode"] in ("allow_fp32_to_fp16", "must_keep_origin_dtype")
    )


@flags.multi_flags_validator(
    ["precision_mode", "frontend"],
    message="--precision_mode is an NPURunConfig setting: use it with --frontend=estimator "
    "(Keras: --accelerate_train_mode)",
)
def _precision_is_estimator(v):
    return v["precision_mode"] is None or v["frontend"] == "estimator"


@flags.multi_flags_validator(
    ["data", "format"], message="--format applies to --data paths, not to the built-in data names"
)
def _format_needs_path(v):
    return v["format"] is None or v["data"] not in DATA_NAMES


@flags.multi_flags_validator(
    ["kafka", "topic", "data"],
    message="--kafka and --topic go together, and replace --data (leave --data out)",
)
def _kafka_needs_topic(v):
    if v["kafka"] is None and v["topic"] is None:
        return True
    return bool(v["kafka"]) and bool(v["topic"]) and v["data"] == "synthetic"


def _matches_no_file(value: str, names: tuple[str, ...] = ()) -> str | None:
    """Why `value` names no data (a typo of `names`, or no file), else None."""
    if value is None or value in names or glob.glob(value):
        return None
    close = difflib.get_close_matches(value, names, n=1)
    if close:
        return (
            f"{value!r} is neither a data name nor an existing file; did you mean "
            f"--data={close[0]}?"
        )
    also = f", or one of {', '.join(names)}" if names else ""
    return f"{value!r} matches no file. Give an existing file or glob{also}."


def _is_directory(name: str, value: str) -> str | None:
    if value is None or not os.path.isdir(value):
        return None
    return (
        f"--{name}={value!r} is a directory; --{name} names data files: give a file or "
        f"a glob pattern such as --{name}={os.path.join(value, '*.csv')!r}"
    )


@flags.validator("data")
def _data_exists(value):
    why = _is_directory("data", value) or _matches_no_file(value, DATA_NAMES)
    if why:
        raise flags.ValidationError(why)
    return True


@flags.validator("eval_data")
def _eval_data_exists(value):
    why = _is_directory("eval_data", value) or _matches_no_file(value)
    if why:
        raise flags.ValidationError(why)
    return True


def _finite_positive(name: str):
    def check(value):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise flags.ValidationError(
                f"--{name} must be a finite number > 0. Received: --{name}={value!r}"
            )
        return True

    flags.register_validator(name, check)


_finite_positive("learning_rate")
_finite_positive("sparse_learning_rate")


@flags.validator("model_dir")
def _model_dir_is_a_directory(value):
    blocker = value and file_in_the_way(value)
    if blocker:
        raise flags.ValidationError(
            f"{blocker!r} is a file, not a directory: give another "
            "--model_dir (or move the file away)."
        )
    return True


def check_now() -> None:
    """Re-runs every validator (tests set flags with flagsaver, which validates too)."""
    flags.FLAGS.validate_all_flags()
