r"""Trains a reference click model and prints its metrics.

Examples:
  python scripts/train.py                          # DeepFM on synthetic data
  python scripts/train.py --data=criteo_sample --max_steps=200 --batch_size=32
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from npu_rec import data as npd  # noqa: E402
from npu_rec.models import build_deepfm, hashed_embedding_fn  # noqa: E402

_MODEL = flags.DEFINE_enum("model", "deepfm", ["deepfm"], "The reference model to train.")
_DATA = flags.DEFINE_enum(
    "data", "synthetic", ["synthetic", "criteo_sample"], "Training data: generated or shipped."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 1024, "Examples per step.", lower_bound=1)
_MAX_STEPS = flags.DEFINE_integer("max_steps", 400, "Training steps.", lower_bound=1)
_EVAL_ROWS = flags.DEFINE_integer(
    "eval_rows", 50_000, "Held-out synthetic rows to evaluate on.", lower_bound=1
)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Where to write the trained model and metrics.json (optional)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the data and the model.")
_HASH_BUCKETS = flags.DEFINE_integer(
    "hash_buckets", 2**14, "Rows per feature of the hashed embeddings.", lower_bound=1
)
_VERBOSE = flags.DEFINE_integer("verbose", 1, "Keras verbosity: 0 silent, 1 progress bar.")


class _Throughput(keras.callbacks.Callback):
    """Measures training samples/s, the first (tracing) batch excluded."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        self.samples = 0
        self.seconds = 0.0
        self._start = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if batch > 0 or self.params.get("steps") == 1:
            self.samples += self.batch_size
            self.seconds += time.perf_counter() - self._start

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def _load_data(data: str, seed: int, train_rows: int, eval_rows: int):
    if data == "synthetic":
        gen = npd.SyntheticCriteo(seed=seed)
        train = gen.rows(0, train_rows)
        test = gen.rows(train_rows, train_rows + eval_rows)
        return train, test, npd.DENSE_NAMES, npd.CATEGORICAL_NAMES
    spec = npd.SAMPLES[data]
    rows = npd.load_sample(data)
    n = len(rows[spec["label"]])
    cut = int(n * 0.8)
    rows["label"] = rows.pop(spec["label"])
    train = {k: v[:cut] for k, v in rows.items()}
    test = {k: v[cut:] for k, v in rows.items()}
    return train, test, spec["dense"], spec["categorical"]


def run(
    *,
    data: str,
    batch_size: int,
    max_steps: int,
    seed: int,
    model_dir: str | None,
    eval_rows: int,
    hash_buckets: int,
    verbose: int,
) -> dict:
    """Trains DeepFM and returns its metrics (also printed)."""
    keras.utils.set_random_seed(seed)
    train, test, dense_names, cat_names = _load_data(data, seed, batch_size * max_steps, eval_rows)
    features = (*dense_names, *cat_names)
    n_train = len(train["label"])

    def dataset(rows, shuffle: bool):
        ds = tf.data.Dataset.from_tensor_slices(
            ({k: rows[k] for k in features}, rows["label"].astype("float32"))
        )
        if shuffle:
            ds = ds.shuffle(min(n_train, 100_000), seed=seed)
        return ds.batch(batch_size).prefetch(2)

    model = build_deepfm(dense_names, cat_names, hashed_embedding_fn(hash_buckets, seed), seed=seed)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    steps_per_epoch = max(1, -(-n_train // batch_size))
    epochs = -(-max_steps // steps_per_epoch)
    meter = _Throughput(batch_size)
    start = time.perf_counter()
    model.fit(
        dataset(train, shuffle=True).repeat(),
        epochs=epochs,
        steps_per_epoch=min(steps_per_epoch, max_steps),
        callbacks=[meter],
        shuffle=False,
        verbose=verbose,
    )
    train_seconds = time.perf_counter() - start
    results = model.evaluate(dataset(test, shuffle=False), return_dict=True, verbose=0)
    metrics = {
        "model": "deepfm",
        "data": data,
        "steps": epochs * min(steps_per_epoch, max_steps),
        "batch_size": batch_size,
        "eval_loss": float(results["loss"]),
        "eval_auc": float(results["auc"]),
        "train_seconds": round(train_seconds, 2),
        "samples_per_sec": round(meter.samples_per_sec, 1),
    }
    if model_dir:
        os.makedirs(model_dir, exist_ok=True)
        model.save(os.path.join(model_dir, "model.keras"))
        with open(os.path.join(model_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=2)
    print(
        f"eval_loss={metrics['eval_loss']:.4f} eval_auc={metrics['eval_auc']:.4f} "
        f"samples_per_sec={metrics['samples_per_sec']:.0f} "
        f"train_seconds={metrics['train_seconds']:.1f}"
    )
    return metrics


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    run(
        data=_DATA.value,
        batch_size=_BATCH_SIZE.value,
        max_steps=_MAX_STEPS.value,
        seed=_SEED.value,
        model_dir=_MODEL_DIR.value,
        eval_rows=_EVAL_ROWS.value,
        hash_buckets=_HASH_BUCKETS.value,
        verbose=_VERBOSE.value,
    )


if __name__ == "__main__":
    app.run(main)
