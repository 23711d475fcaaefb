"""TensorBoard events written without TensorFlow: TensorBoard and TensorFlow read them, and a
resume cuts them back to the restored step, dropping what a killed run left half-written."""

import pathlib

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from bertjax.training import events, metrics


def written(workdir, steps) -> None:
    writer = metrics.MetricWriter(str(workdir))
    for step in steps:
        writer.write(step, {"loss": 1.0 / step, "learning_rate": 1e-4 * step})
    writer.close()


def event_files(workdir) -> list[pathlib.Path]:
    return sorted(pathlib.Path(workdir, metrics.TENSORBOARD_DIR).glob("events.out.tfevents.*"))


def tf_events(workdir) -> list[event_pb2.Event]:
    """Every event, read by TensorFlow's own TFRecord reader (it raises on a damaged file)."""
    return [event_pb2.Event.FromString(record.numpy()) for path in event_files(workdir)
            for record in tf.data.TFRecordDataset(str(path))]


def logged_steps(workdir, tag="loss") -> list[int]:
    return [e.step for e in tf_events(workdir) for v in e.summary.value if v.tag == tag]


def test_tensorboard_shows_each_scalar_at_its_step(tmp_path):
    written(tmp_path, [1, 2, 5])
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path / metrics.TENSORBOARD_DIR), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    assert sorted(accumulator.Tags()[event_accumulator.TENSORS]) == ["learning_rate", "loss"]
    loss = accumulator.Tensors("loss")
    assert [e.step for e in loss] == [1, 2, 5]
    np.testing.assert_allclose([tensor_util.make_ndarray(e.tensor_proto) for e in loss],
                               [1.0, 0.5, 0.2], rtol=1e-6)
    assert tf_events(tmp_path)[0].file_version == "brain.Event:2"


def test_a_resume_cuts_the_events_back_and_the_new_run_continues_after_them(tmp_path):
    written(tmp_path, range(1, 7))
    warnings = []
    events.truncate(str(tmp_path / metrics.TENSORBOARD_DIR), 4, warnings.append)
    assert not warnings and logged_steps(tmp_path) == [1, 2, 3, 4]
    written(tmp_path, [5, 6])  # the resumed run: a second file, sorted after the kept events
    assert len(event_files(tmp_path)) == 2
    assert logged_steps(tmp_path) == [1, 2, 3, 4, 5, 6]
    metrics.truncate_logs(str(tmp_path), 5)  # both files go into one
    assert len(event_files(tmp_path)) == 1 and logged_steps(tmp_path) == [1, 2, 3, 4, 5]
    assert sum(e.file_version == "brain.Event:2" for e in tf_events(tmp_path)) == 1


def test_a_half_written_or_damaged_last_event_is_dropped_with_a_warning(tmp_path):
    for damage in ("cut", "flipped"):
        workdir = tmp_path / damage
        written(workdir, range(1, 4))
        (path,) = event_files(workdir)
        data = bytearray(path.read_bytes())
        if damage == "cut":  # killed while writing: half of the last record is on disk
            data = data[:-30]
        else:  # the last record's payload no longer matches its checksum
            data[-10] ^= 0x01
        path.write_bytes(bytes(data))
        warnings = []
        events.truncate(str(workdir / metrics.TENSORBOARD_DIR), 10, warnings.append)
        assert len(warnings) == 1 and "dropped a partial last event" in warnings[0]
        assert str(path) in warnings[0]
        # The last record held step 3's learning rate; every whole record before it is kept.
        assert logged_steps(workdir) == [1, 2, 3]
        assert logged_steps(workdir, "learning_rate") == [1, 2]


def test_a_long_run_rolls_over_to_new_files_that_read_as_one(tmp_path):
    directory = str(tmp_path / metrics.TENSORBOARD_DIR)
    writer = events.EventFile(directory, roll_bytes=1000)
    for step in range(1, 21):
        writer.scalars(step, {"loss": 1.0 / step, "learning_rate": 1e-4})
    writer.close()
    assert len(event_files(tmp_path)) >= 3  # about 230 bytes a step
    assert all(path.stat().st_size < 1000 + 300 for path in event_files(tmp_path))
    assert logged_steps(tmp_path) == list(range(1, 21))
    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    assert [e.step for e in accumulator.Tensors("loss")] == list(range(1, 21))
    events.truncate(directory, 12, [].append)
    assert len(event_files(tmp_path)) == 1 and logged_steps(tmp_path) == list(range(1, 13))
