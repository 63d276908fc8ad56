"""Each trainer's reading position on the ps route (`npu_rec/estimator/_ps/_position.py`), in one process.

The cluster scenario (positions advanced by asynchronous trainers, committed,
resumed after a kill) is `tests/distribute/test_ps_estimator.py`.
"""

import tensorflow as tf

from npu_rec.data import SyntheticSource
from npu_rec.estimator import _data_position_hook
from npu_rec.estimator._ps import _position as _ps_position
from npu_rec.training._data_position import save_position


def _state(position):
    source = SyntheticSource(num_rows=None, seed=1)
    source.restore_from_checkpoint({**source.get_checkpoint_state(), "position": position})
    return source.get_checkpoint_state()


def test_trainer_names_are_the_chief_then_the_workers():
    spec = tf.train.ClusterSpec({"chief": ["a:1"], "worker": ["a:2", "a:3"], "ps": ["a:4"]})
    assert _ps_position.trainer_names(spec) == ["chief:0", "worker:0", "worker:1"]


def test_positions_load_and_read_back_per_trainer():
    names = ["chief:0", "worker:0", "worker:1"]
    with tf.Graph().as_default():
        positions = _ps_position.TrainerPositions(names)
        with tf.compat.v1.Session() as session:
            positions.load(session, {"chief:0": _state(64), "worker:1": _state(640)})
            got = positions.read(session)
    assert got == {"chief:0": _state(64), "worker:0": None, "worker:1": _state(640)}


def test_a_cluster_file_and_a_one_process_file_do_not_mix(tmp_path):
    cluster = str(tmp_path / "data_position-5.json")
    save_position(cluster, {"trainers": {"chief:0": _state(128), "worker:0": _state(256)}})
    assert _ps_position.committed_states(cluster) == {
        "chief:0": _state(128),
        "worker:0": _state(256),
    }
    # One process continues where its source is: no trainer's share is its share.
    source = SyntheticSource(num_rows=None, seed=1)
    assert _data_position_hook.restore(cluster, 5, source) is False
    assert source.get_checkpoint_state()["position"] == 0

    single = str(tmp_path / "data_position-6.json")
    save_position(single, _state(64))
    assert _ps_position.committed_states(single) == {}  # each trainer reads from its start
    assert _ps_position.committed_states(None) == {}
    assert _ps_position.committed_states(str(tmp_path / "missing.json")) == {}
