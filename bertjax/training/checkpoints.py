"""Checkpoints on disk (the only file that imports Orbax): model directories and run checkpoints.

A *model directory* is what conversion writes and what pretraining (`init_checkpoint`) and
fine-tuning start from:

  DIR/config.json   the model config, in original `bert_config.json` key names
  DIR/params/       the parameter pytree, an Orbax checkpoint
  DIR/vocab.txt or DIR/spm.model   the tokenizer

It is written so that a crash never leaves a half-written directory that reads as a model
(see `save_model`). Paths may be local or remote (gs://), as everywhere in Orbax.

A *run* (a training workdir) keeps Orbax checkpoints under WORKDIR/checkpoints/<step>/ with
the items `params`, `opt_state`, `progress` (step and RNG, arrays) and `host` (JSON: the data
position and whatever else the loop needs to continue exactly). `RunCheckpoints` saves them
asynchronously, keeps the newest N, and turns SIGTERM (preemption) and Ctrl-C into a save at
the next step boundary. A pretraining run also keeps WORKDIR/architecture/ (its model config
and tokenizer), so its latest checkpoint reads as a model before the run has exported one.

`open_model` is the one place that tells what a path given as a model is: a model
directory, a finished run's workdir (its exported WORKDIR/model), or a pretraining workdir
(its latest checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from bertjax import files
from bertjax.models.bert import BertConfig
from bertjax.training import integrity

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
FINGERPRINTS_FILE = "fingerprints.json"  # a model directory's, beside params/ (integrity.py)
MODEL_DIR = "model"  # the model directory a finished run exports into its workdir
ARCHITECTURE_DIR = "architecture"  # a pretraining workdir's model config and tokenizer


def _flat_shapes(tree) -> dict[str, tuple]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
            for path, leaf in flat}


def check_same_shapes(expected, found, where: str) -> None:
    """Raises a clear error naming the first tensors whose names or shapes differ."""
    want, have = _flat_shapes(expected), _flat_shapes(found)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    wrong = [f"{k}: checkpoint {have[k]}, model {want[k]}"
             for k in sorted(set(want) & set(have)) if want[k] != have[k]]
    problems = ([f"missing {k}" for k in missing[:5]] + [f"unexpected {k}" for k in extra[:5]]
                + wrong[:5])
    if problems:
        raise ValueError(f"{where} does not match the model (another model size or "
                         f"architecture?): " + "; ".join(problems))


def _tree_metadata(metadata) -> Any:
    return getattr(metadata, "tree", metadata)


class CorruptCheckpoint(ValueError):
    """What was read back is not what was written (or could not be read at all)."""


def verify(tree: Any, expected: integrity.Fingerprints | None, where: str) -> None:
    """Raises CorruptCheckpoint when `tree` differs from its fingerprints or is not finite."""
    found = integrity.fingerprints(tree)
    wrong = integrity.mismatches(found, expected) if expected is not None else []
    if wrong:
        raise CorruptCheckpoint(f"{where} is corrupt: {len(wrong)} of {len(found)} arrays differ "
                                f"from what was saved (first: {wrong[0]})")
    bad = integrity.non_finite(found)
    if bad:
        raise CorruptCheckpoint(f"{where} holds non-finite values in {len(bad)} of {len(found)} "
                                f"arrays (first: {bad[0]})")


_path = files.path


@functools.cache
def _whole_arrays_on_cpu() -> None:
    """On CPU devices, every replica's copy of an array is in the one host's memory, and
    Orbax's replica-parallel saving (each replica writes a slice of a replicated array, so
    that hosts share the writes) only adds a compiled slice per array shape and replica: 80
    compiles, about 4 s, on the first save of a small model over 8 devices. Orbax already
    turns it off on GPUs; this turns it off on CPUs, leaving TPUs as Orbax sets them."""
    if jax.devices()[0].platform != "cpu":
        return
    absl_logger = logging.getLogger("absl")  # Orbax warns of every override, on every run
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
            override=True)
    finally:
        absl_logger.setLevel(level)


def save_params(path: str, params: Any) -> None:
    """Saves a parameter pytree (plain arrays) as an Orbax checkpoint at `path`."""
    _whole_arrays_on_cpu()
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(_path(path), params, force=True)


def restore_params(path: str, abstract_params: Any | None = None,
                   fingerprints: integrity.Fingerprints | None = None) -> Any:
    """Restores parameters; with `abstract_params` (ShapeDtypeStructs, optionally sharded)
    they are checked against it and placed as it says, without it they go to this process's
    first device, whatever the topology they were saved from. They are verified against
    `fingerprints` when given, and must be finite."""
    path = _path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no parameter checkpoint there")
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            stored = _tree_metadata(checkpointer.metadata(path).item_metadata)
        except Exception as e:  # noqa: BLE001 - whatever Orbax raises on damaged metadata
            raise CorruptCheckpoint(f"{path} cannot be read: {_brief(e)}") from None
        if abstract_params is None:
            abstract_params = on_first_device(stored)
        check_same_shapes(abstract_params, stored, str(path))
        try:
            params = checkpointer.restore(path, abstract_params)
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpoint(f"{path} cannot be read: {_brief(e)}") from None
    verify(params, fingerprints, str(path))
    return params


def _brief(error: BaseException) -> str:
    """The first line of an error from deep inside a storage library."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def save_model(directory: str, params: Any, config: BertConfig, tokenizer=None,
               overwrite: bool = False) -> str:
    """Writes a model directory; `tokenizer` (a bertjax Tokenizer) is optional.

    Every process must call it (each writes its own parameter shards); process 0 writes the
    config and tokenizer. A local directory is built under a temporary name and renamed into
    place. Object stores (gs://) cannot rename directories: there `config.json` is removed
    first and written last, so the directory only reads as a model once it is complete.
    """
    final = _path(directory)
    primary = jax.process_index() == 0
    if (final / CONFIG_FILE).exists() and not overwrite:
        raise FileExistsError(f"{final} already exists (pass overwrite to replace it)")
    remote = "://" in str(final)
    # One name all processes agree on; a leftover from a crashed export is removed first.
    target = final if remote else epath.Path(f"{final}.partial")
    if primary:
        if remote:
            if (final / CONFIG_FILE).exists():
                (final / CONFIG_FILE).unlink()
        elif target.exists():
            target.rmtree()
        target.mkdir(parents=True, exist_ok=True)
    multihost_utils.sync_global_devices("bertjax_save_model_start")
    try:
        prints = integrity.fingerprints(params)
        save_params(str(target / PARAMS_DIR), params)
        multihost_utils.sync_global_devices("bertjax_save_model_params")
        if primary:
            if tokenizer is not None:
                tokenizer.save(str(target))
            files.write_json(target / FINGERPRINTS_FILE, prints)
            write_model_config(str(target), config)
            if not remote:
                if final.exists():
                    final.rmtree()
                target.rename(final)
    except BaseException:
        if primary and not remote and target.exists():
            target.rmtree()
        raise
    multihost_utils.sync_global_devices("bertjax_save_model_done")
    return str(final)


def write_model_config(directory: str, config: BertConfig) -> None:
    files.write_text(_path(directory) / CONFIG_FILE, json.dumps(
        {"model_type": "bert", **config.to_dict()}, indent=2, sort_keys=True))


def load_model_config(directory: str, **overrides) -> BertConfig:
    path = _path(directory) / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {directory!r} is not a bertjax model directory")
    try:
        return BertConfig.from_dict(files.read_json(path), **overrides)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


CHECKPOINTS_DIR = "checkpoints"


def _item_handlers() -> dict:
    """How each item is stored, so metadata can be read before anything is restored."""
    return {"params": ocp.StandardCheckpointHandler(),
            "opt_state": ocp.StandardCheckpointHandler(),
            "progress": ocp.StandardCheckpointHandler(),
            "host": ocp.JsonCheckpointHandler()}


class RunCheckpoints:
    """A training run's checkpoints in WORKDIR/checkpoints, saved asynchronously, the newest
    `keep` kept (Orbax's `LatestN` preservation policy).

    Preemption is asked at each step boundary (`preemption_requested(step)`); the loop then
    saves and exits. Orbax's check (`CheckpointManager.reached_preemption`) is JAX's
    preemption sync manager, which `jax.distributed.initialize` starts: it hears SIGTERM on
    any process and makes every process agree on the step to save. It hears nothing else: a
    single process started without `jax.distributed` has no sync manager, and none listens
    for Ctrl-C. So a single process keeps the one hand-made part, a handler that sets a flag
    on SIGTERM and on a first Ctrl-C (SIGINT), which saves like SIGTERM; a second Ctrl-C
    interrupts at once. Several processes leave both signals to JAX (Ctrl-C stops the one
    process it reaches): a flag set on one host alone would save on that host only.
    """

    def __init__(self, workdir: str, keep: int):
        _whole_arrays_on_cpu()
        self.directory = str(_path(workdir) / CHECKPOINTS_DIR)
        self.manager = ocp.CheckpointManager(
            self.directory, item_handlers=_item_handlers(),
            options=ocp.CheckpointManagerOptions(
                preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True,
                enable_async_checkpointing=True))
        self._signalled = False
        self._previous_handlers = {}
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        del frame
        self._signalled = True
        if signum == signal.SIGINT:  # a second Ctrl-C stops at once
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def preemption_requested(self, step: int) -> bool:
        """Whether to save `step` and stop. Every process must ask at every step: JAX's sync
        protocol counts on it."""
        return self.manager.reached_preemption(step) or self._signalled

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, *, params: Any, opt_state: Any, progress: Any,
             host: dict) -> None:
        """Starts an asynchronous save; the arrays are copied before it returns."""
        with self._saving():
            self.manager.save(step, force=True, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                progress=ocp.args.StandardSave(progress),
                host=ocp.args.JsonSave(host)))

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def delete(self, step: int) -> None:
        self.manager.delete(step)

    @contextlib.contextmanager
    def _saving(self):
        """A failed save (a full disk, a lost bucket), whatever the storage layer raised, as
        one error naming the directory."""
        try:
            yield
        except Exception as e:  # noqa: BLE001
            raise OSError(f"saving a checkpoint in {self.directory} failed ({_brief(e)}); the "
                          f"checkpoints saved before it are intact") from None

    def raise_save_errors(self) -> None:
        """An asynchronous save that failed, as soon as it is known (each step asks)."""
        with self._saving():
            self.manager.check_for_errors()

    def restore(self, step: int, *, abstract_params: Any, abstract_opt_state: Any,
                abstract_progress: Any) -> dict:
        """{'params', 'opt_state', 'progress', 'host'} of `step`, placed as the abstract
        trees (ShapeDtypeStructs with shardings) say, after checking the shapes match.

        A model of another size is a ValueError; a checkpoint that cannot be read, or whose
        arrays differ from the fingerprints saved with it, is a CorruptCheckpoint."""
        where = f"checkpoint {os.path.join(self.directory, str(step))}"
        try:
            metadata = self.manager.item_metadata(step)
            stored_params = _tree_metadata(metadata["params"])
            stored_opt_state = _tree_metadata(metadata["opt_state"])
        except Exception as e:  # noqa: BLE001 - missing or damaged items
            raise CorruptCheckpoint(f"{where} cannot be read: {_brief(e)}") from None
        check_same_shapes(abstract_params, stored_params, where)
        try:
            check_same_shapes(abstract_opt_state, stored_opt_state, where)
        except ValueError as e:
            raise ValueError(f"{e} (the optimizer state differs: was the run started with "
                             f"another optimizer.name?)") from None
        try:
            restored = dict(self.manager.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params),
                opt_state=ocp.args.StandardRestore(abstract_opt_state),
                progress=ocp.args.StandardRestore(abstract_progress),
                host=ocp.args.JsonRestore())))
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpoint(f"{where} cannot be read: {_brief(e)}") from None
        expected = restored["host"].get("fingerprints", {})
        verify(restored["params"], expected.get("params"), f"{where} (params)")
        verify(restored["opt_state"], expected.get("opt_state"), f"{where} (opt_state)")
        return restored

    def close(self) -> None:
        try:
            with self._saving():
                self.manager.wait_until_finished()
        finally:
            self.manager.close()
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}


def write_architecture(workdir: str, config: BertConfig, tokenizer=None) -> None:
    """What makes a pretraining workdir's checkpoints read as a model (process 0 only)."""
    directory = _path(workdir) / ARCHITECTURE_DIR
    files.makedirs(directory)
    if tokenizer is not None:
        tokenizer.save(str(directory))
    write_model_config(str(directory), config)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model's config, tokenizer and parameters, wherever `open_model` found them."""

    config: BertConfig
    tokenizer_dir: str
    params_dir: str  # a model directory's params/, or a run checkpoint's params item
    model_dir: str | None  # the model directory (maybe with task.json); None for a run
    fingerprints: integrity.Fingerprints | None  # of the params, when they were saved with them

    def param_metadata(self) -> Any:
        """The stored parameter tree of ShapeDtypeStruct-like leaves (nothing is read)."""
        with ocp.StandardCheckpointer() as checkpointer:
            return _tree_metadata(checkpointer.metadata(_path(self.params_dir)).item_metadata)

    def load_params(self, abstract_params: Any | None = None) -> Any:
        """The parameters, checked against and placed as `abstract_params` (if given), and
        verified against their fingerprints."""
        return restore_params(self.params_dir, abstract_params, self.fingerprints)


def open_model(path: str, tokenizer: str = "") -> ModelSource:
    """What `path` holds as a model: a model directory (conversion output, an export), a
    finished run's workdir (its WORKDIR/model), or a pretraining workdir (its latest
    checkpoint, even mid-run). `tokenizer` overrides where the tokenizer is read from."""
    p = _path(path)
    run = p / ARCHITECTURE_DIR
    if not (p / CONFIG_FILE).exists() and (run / CONFIG_FILE).exists() and (
            p / CHECKPOINTS_DIR).is_dir():  # a pretraining run: newer than any export
        with ocp.CheckpointManager(str(p / CHECKPOINTS_DIR), item_handlers=_item_handlers(),
                                   options=ocp.CheckpointManagerOptions(read_only=True)) as mngr:
            step = mngr.latest_step()
            if step is None:
                raise FileNotFoundError(f"{path}: the pretraining run has no checkpoint yet")
            host = mngr.restore(step, args=ocp.args.Composite(host=ocp.args.JsonRestore()))
        return ModelSource(load_model_config(str(run)), tokenizer or str(run),
                           str(p / CHECKPOINTS_DIR / str(step) / "params"), None,
                           host["host"].get("fingerprints", {}).get("params"))
    for model_dir in (p, p / MODEL_DIR):
        if (model_dir / CONFIG_FILE).exists():
            prints = model_dir / FINGERPRINTS_FILE
            return ModelSource(load_model_config(str(model_dir)), tokenizer or str(model_dir),
                               str(model_dir / PARAMS_DIR), str(model_dir),
                               files.read_json(prints) if prints.exists() else None)
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such model directory or workdir")
    raise FileNotFoundError(
        f"{path}: neither a model directory (with {CONFIG_FILE}) nor a workdir with an "
        f"exported model ({MODEL_DIR}/{CONFIG_FILE}) or pretraining checkpoints "
        f"({CHECKPOINTS_DIR}/ and {ARCHITECTURE_DIR}/)")


def load_model(path: str, abstract_params: Any | None = None) -> tuple[BertConfig, Any]:
    """(config, params) of anything `open_model` reads."""
    source = open_model(path)
    return source.config, source.load_params(abstract_params)


def on_first_device(metadata: Any) -> Any:
    """ShapeDtypeStructs placing each array on this process's first device."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        metadata)
