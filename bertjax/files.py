"""The one file layer: every file bertjax reads or writes, local and gs:// alike.

Paths are `etils.epath` paths (with TensorFlow installed, gs:// goes through TensorFlow's
Cloud Storage client, the one tf.data uses too), so a run's workdir, shards
and model directories may live in a bucket or on a local disk with the same code.

Writes are atomic: a file is written under a temporary name beside its target and renamed
into place, so a reader sees the old content or the new, never half of it. A directory
(`staged_directory`) is built in full and then published: renamed into place on a local
disk; copied file by file on object stores, which cannot rename directories, with the file
that marks it complete written last.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from typing import Any, Iterator

from etils import epath

Path = epath.Path
PathLike = str | os.PathLike


def is_remote(path: PathLike) -> bool:
    return "://" in os.fspath(path)


def path(p: PathLike) -> epath.Path:
    """An absolute local path, or a remote URL as it is."""
    p = os.fspath(p)
    return epath.Path(p if is_remote(p) else os.path.abspath(os.path.expanduser(p)))


def _missing(p: epath.Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(f"{p}: no such {what}")


def _existing_file(p: PathLike) -> epath.Path:
    p = path(p)
    if not p.is_file():
        raise _missing(p, "file") if not p.exists() else IsADirectoryError(
            f"{p} is a directory, expected a file")
    return p


def read_bytes(p: PathLike) -> bytes:
    return _existing_file(p).read_bytes()


def read_text(p: PathLike) -> str:
    """The file's text as UTF-8; a decoding error names the file and the byte offset."""
    data = read_bytes(p)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path(p)}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_json(p: PathLike) -> Any:
    text = read_text(p)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path(p)}: not valid JSON ({e})") from None


class _RawReader(io.RawIOBase):
    """A remote file object (TensorFlow's GFile) as a standard raw stream, so the io module
    (buffering, text decoding, gzip) can read it."""

    def __init__(self, f):
        self._f = f

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._f.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self._f.tell()


@contextlib.contextmanager
def open_binary(p: PathLike) -> Iterator[Any]:
    """A binary stream for reading a file piece by piece (corpora larger than memory)."""
    p = _existing_file(p)
    with p.open("rb") as f:
        yield io.BufferedReader(_RawReader(f), 1 << 20) if is_remote(p) else f


@contextlib.contextmanager
def local_copy(p: PathLike) -> Iterator[str]:
    """A local path to read `p` from, for libraries that open files by name only (safetensors'
    and PyTorch's memory maps): `p` itself on a local disk, a temporary copy of a remote file,
    removed on exit."""
    p = _existing_file(p)
    if not is_remote(p):
        yield os.fspath(p)
        return
    with tempfile.TemporaryDirectory(prefix="bertjax-copy-") as local:
        copy = os.path.join(local, p.name)
        with open_binary(p) as source, open(copy, "wb") as target:
            shutil.copyfileobj(source, target, 16 << 20)
        yield copy


def size(p: PathLike) -> int:
    return path(p).stat().length


def _temporary_sibling(p: epath.Path) -> epath.Path:
    return p.with_name(f"{p.name}.tmp-{uuid.uuid4().hex[:8]}")


def write_bytes(p: PathLike, data: bytes) -> epath.Path:
    """Writes `data` to `p` atomically (temporary sibling, then rename)."""
    p = path(p)
    tmp = _temporary_sibling(p)
    try:
        tmp.write_bytes(data)
        tmp.replace(p)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    return p


def write_text(p: PathLike, text: str) -> epath.Path:
    return write_bytes(p, text.encode("utf-8"))


def write_json(p: PathLike, obj: Any, **dumps) -> epath.Path:
    return write_text(p, json.dumps(obj, ensure_ascii=False, **dumps) + "\n")


def write_jsonl(p: PathLike, records) -> epath.Path:
    return write_text(p, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


class AppendedFile:
    """A log file that grows by appending (metrics.jsonl, TensorBoard events): written in
    place on a local disk, each write flushed. Object stores (gs://) cannot append, so there
    the content is kept in memory and the whole file rewritten atomically, at most every
    `remote_flush_s` seconds and on close; a run killed in between loses that much log."""

    def __init__(self, p: PathLike, remote_flush_s: float = 60.0):
        self.path, self.remote = path(p), is_remote(p)
        self.remote_flush_s, self._flushed = remote_flush_s, -math.inf
        if self.remote:
            self._data = bytearray(self.path.read_bytes() if self.path.exists() else b"")
            self.size = len(self._data)
        else:
            self._file = open(self.path, "ab")
            self.size = self._file.tell()

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if not self.remote:
            self._file.write(data)
            self._file.flush()
            return
        self._data += data
        if time.monotonic() - self._flushed > self.remote_flush_s:
            self._publish()

    def flush(self) -> None:
        """Nothing to do: local writes are flushed as made, remote ones on their clock."""

    def _publish(self) -> None:
        write_bytes(self.path, bytes(self._data))
        self._flushed = time.monotonic()

    def close(self) -> None:
        if self.remote:
            self._publish()
        else:
            self._file.close()


def makedirs(p: PathLike) -> epath.Path:
    p = path(p)
    if p.exists() and not p.is_dir():
        raise NotADirectoryError(f"{p} is a file, expected a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(f"{p}: a parent of it is a file, expected a directory") \
            from None
    return p


def remove_tree(p: PathLike) -> None:
    p = path(p)
    if p.is_dir():
        p.rmtree()
    elif p.exists():
        p.unlink()


def copy_file(src: PathLike, dst: PathLike) -> epath.Path:
    """Copies one file (local or remote, either side); the target appears whole."""
    return write_bytes(dst, read_bytes(src))


def glob(pattern: str) -> list[str]:
    """The files `pattern` names (a path, or wildcards after a plain directory), sorted."""
    wild = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=-1)
    if wild < 0:
        p = path(pattern)
        return [os.fspath(p)] if p.is_file() else []
    base, _, rest = pattern[:wild].rpartition("/")
    rest += pattern[wild:]
    root = path(base or ".")
    if not root.is_dir():
        return []
    return sorted(os.fspath(p) for p in root.glob(rest) if p.is_file())


@contextlib.contextmanager
def staged_directory(final: PathLike, marker: str) -> Iterator[epath.Path]:
    """Yields a local directory to build `final` in; on success it is published.

    Locally: a temporary sibling renamed into place (replacing what was there). Remote: a
    local temporary directory whose files are copied up, `marker` (the file that says the
    directory is complete, e.g. config.json) removed from the target first and copied last,
    so the remote directory never reads as complete before it is. On failure nothing of the
    new content is published.
    """
    final = path(final)
    if is_remote(final):
        with tempfile.TemporaryDirectory(prefix="bertjax-stage-") as local:
            yield epath.Path(local)
            publish_remote(epath.Path(local), final, marker)
        return
    for stale in final.parent.glob(f"{final.name}.tmp-*"):  # left by a killed earlier run
        remove_tree(stale)
    stage = _temporary_sibling(final)
    stage.mkdir(parents=True)
    try:
        yield stage
        replace_directory(stage, final)
    except BaseException:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
        raise


def replace_directory(stage: epath.Path, final: epath.Path) -> None:
    """Local: moves a complete `stage` directory to `final`, replacing what was there."""
    trash = None
    if final.exists():
        trash = final.with_name(f"{final.name}.old-{uuid.uuid4().hex[:8]}")
        final.rename(trash)
    stage.rename(final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def publish_remote(local: epath.Path, final: epath.Path, marker: str) -> None:
    """Copies a complete local directory tree to a remote one, `marker` last."""
    if (final / marker).exists():
        (final / marker).unlink()
    names = sorted((os.path.relpath(os.path.join(parent, name), local)
                    for parent, _, names in os.walk(local) for name in names),
                   key=lambda n: (n == marker, n))
    for name in names:
        copy_file(local / name, final / name)
