"""TensorBoard works out of the box: the callback on a RecModel, and the command the docs name."""

import os
import subprocess
import sys

import keras
import tensorflow as tf

from tests.keras.builders import criteo, deepfm_recmodel


def test_tensorboard_callback_writes_train_and_validation_events(tmp_path):
    x, y = criteo(0, 512)
    model = deepfm_recmodel(categorical=("C1", "C2"))
    log_dir = tmp_path / "logs"
    model.fit(
        x,
        y,
        batch_size=128,
        epochs=2,
        validation_data=criteo(512, 640),
        callbacks=[keras.callbacks.TensorBoard(str(log_dir), histogram_freq=1)],
        verbose=0,
    )
    for split in ("train", "validation"):
        events = list((log_dir / split).glob("events.out.tfevents.*"))
        assert events, f"no {split} events in {log_dir}"
        tags = {
            v.tag
            for e in tf.compat.v1.train.summary_iterator(str(events[0]))
            for v in e.summary.value
        }
        assert "epoch_loss" in tags, tags


def test_the_tensorboard_command_is_installed():
    command = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    assert os.path.exists(command), f"{command} missing: install npu_rec (setup.cfg pins it)"
    result = subprocess.run([command, "--version_tb"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("2."), result.stdout
