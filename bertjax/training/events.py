"""TensorBoard event files: scalars written as training goes, and cut back to a step on resume.

Written with the `tensorboard` package's own pieces (its Event and Summary protos, the scalar
summary `tf.summary.scalar` writes, and its record writer), not through TensorFlow: fine-tuning
needs TensorFlow for nothing else, and importing it cost a run seconds at start and at exit.
The files go through the one file layer (`files.AppendedFile`), so they live wherever the
workdir does; TensorBoard and `tf.data.TFRecordDataset` read them as TensorFlow's own.

A resumed run cuts the files back to its checkpoint's step (`truncate`) rather than leaving
that to TensorBoard, whose own means do not cover every reader. Tried with tensorboard 2.21 and
its data server 0.7.2: a killed run logged `loss` at steps 1-8 and `eval` at step 6, and the
run resumed from step 4 logged `loss` at 5 and 6 again.
  - A `SessionLog.START` event at step 5 (TensorBoard's mark of a restart) made its Python
    loader (`tensorboard --load_fast=false`) drop every tag's steps from 5 on; without one it
    showed both runs' steps.
  - Its default loader, the Rust data server, ignores SessionLog. It drops a tag's later steps
    only when that tag is logged again at an earlier step: it showed the resumed `loss` (old
    5-8 gone) but kept the killed run's `eval` at step 6, with or without the START event,
    until the resumed run logs `eval` at 6 again (never, if it stops or dies before).
  - TensorFlow's readers (`tf.data.TFRecordDataset`, `summary_iterator`) keep every record.
Cut back, the files read the same in all of them from the moment the run resumes.
"""

from __future__ import annotations

import io
import itertools
import os
import socket
import struct
import time
from typing import Callable, Iterator

import google_crc32c
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.record_writer import RecordWriter

from bertjax import files

FILE_PREFIX = "events.out.tfevents."
_file_ids = itertools.count()  # two writers of one process in one second get two files


class EventFile:
    """Event files in `directory` (created if need be), named as TensorFlow names them: by
    creation time first, so a directory's files sort in the order they were written.

    A file that has reached `roll_bytes` is closed and a new one begun (TensorBoard reads
    them all as one run): on gs://, where every flush rewrites the whole object, a week-long
    run would otherwise upload an ever larger file every minute."""

    def __init__(self, directory: str, roll_bytes: int = 4 << 20):
        files.makedirs(directory)
        self._directory, self._roll_bytes = files.path(directory), roll_bytes
        self._start_file()

    def _start_file(self) -> None:
        name = (f"{FILE_PREFIX}{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_file_ids):06d}.v2")
        self._file = files.AppendedFile(self._directory / name)
        self._records = RecordWriter(self._file)
        self._records.write(event_pb2.Event(wall_time=time.time(),
                                            file_version="brain.Event:2").SerializeToString())

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One event per scalar, as `tf.summary.scalar` writes them."""
        if self._file.size >= self._roll_bytes:
            self._records.close()
            self._start_file()
        for name, value in values.items():
            event = event_pb2.Event(wall_time=time.time(), step=int(step),
                                    summary=scalar_pb(name, float(value)))
            self._records.write(event.SerializeToString())

    def close(self) -> None:
        self._records.close()


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated and offset. In C (`google_crc32c`): the pure-Python
    CRC the `tensorboard` package writes with is fine for one small event but takes about
    0.3 s a megabyte, seconds for the logs of a long run on every resume."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _records(path: str, warn: Callable[[str], None]) -> Iterator[bytes]:
    """The records of a TFRecord file (uint64 length, its masked CRC-32C, the data, the
    data's masked CRC-32C). A record cut short or failing its checksums ends the file: a run
    killed while writing leaves one at the end. `tensorboard` ships a writer of this framing
    but reads only through TensorFlow or by file name, not from bytes of the file layer."""
    data, offset = files.read_bytes(path), 0
    while offset < len(data):
        header = data[offset:offset + 12]
        length = struct.unpack("<Q", header[:8])[0] if len(header) == 12 else -1
        end = offset + 12 + length + 4
        if (length < 0 or end > len(data)
                or struct.unpack("<I", header[8:])[0] != _masked_crc32c(header[:8])
                or struct.unpack("<I", data[end - 4:end])[0] != _masked_crc32c(
                    data[offset + 12:end - 4])):
            warn(f"{path}: dropped a partial last event (a run killed while writing)")
            return
        yield data[offset + 12:end - 4]
        offset = end


def truncate(directory: str, last_step: int, warn: Callable[[str], None]) -> None:
    """Drops every summary after `last_step` from the event files in `directory`. The kept
    events (and the first file's version event) take the place of the oldest file, so they
    sort before a resumed run's new file; the others are removed."""
    root = files.path(directory)
    names = sorted(str(p) for p in root.glob(FILE_PREFIX + "*")) if root.is_dir() else []
    if not names:
        return
    kept = io.BytesIO()
    writer, first = RecordWriter(kept), True
    for name in names:
        for record in _records(name, warn):
            event = event_pb2.Event.FromString(record)
            if event.step <= last_step and (event.HasField("summary") or first):
                writer.write(record)
                first = False
    files.write_bytes(names[0], kept.getvalue())
    for name in names[1:]:
        files.remove_tree(name)
