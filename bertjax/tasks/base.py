"""The fine-tuning task interface and the registry the CLIs look tasks up in.

A task family is one file in this package with one `Task` subclass per `task.type` it
serves, decorated with `@register`. The subclass owns everything task-specific: reading its
files (and TFDS datasets), the label vocabulary, featurizing into fixed-length arrays, the
model head, the loss, evaluation into metrics and prediction records, reading `--text` for
`python -m bertjax.predict`, and what the exported model keeps of its settings. The
fine-tuning loop, `predict` and the configs only ever call these methods.

Losses are sums divided by a whole-batch total (`normalizer`), so gradients accumulated over
micro-batches equal the full batch's.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import os
import pkgutil
from typing import Any, ClassVar, Sequence

import jax.numpy as jnp
import ml_collections
from ml_collections.config_dict import placeholder

from bertjax import files
from bertjax.batching import EXAMPLE_WEIGHTS, INPUTS
from bertjax.models.bert import Packing
from bertjax.tasks.features import Features, LabelVocab

TASK_FILE = "task.json"  # a fine-tuned model directory's task settings


@dataclasses.dataclass
class TaskSet:
    name: str  # file base name or TFDS split: names the predictions file
    examples: list
    features: Features
    labelled: bool


@dataclasses.dataclass
class TaskData:
    train: TaskSet
    evals: list[TaskSet]
    predicts: list[TaskSet]
    labels: LabelVocab | None  # the training set's label vocabulary, for tasks that have one


def data_settings() -> ml_collections.ConfigDict:
    """The `task` keys every task reads: where its data is, how it is read, how long a row is.
    """
    s = ml_collections.ConfigDict()
    s.type = placeholder(str)  # the task's name (Task.settings writes it)
    s.train_file = placeholder(str)
    # Labelled files: each is evaluated (metrics + a predictions file).
    s.eval_files = ()
    # Unlabelled files: predictions only, after training.
    s.predict_files = ()
    # tsv | csv | jsonl | conll | squad | text; None tells it from the task and file extension.
    s.format = placeholder(str)
    # Instead of files: a TFDS dataset by name (glue/sst2, glue/mrpc, glue/stsb, squad, ...),
    # already prepared in tfds_data_dir (None: TFDS's default).
    s.tfds_name = placeholder(str)
    s.tfds_data_dir = placeholder(str)
    s.tfds_train_split = "train"
    s.tfds_eval_splits = ("validation",)
    s.max_seq_length = 128
    # The metric that picks the best evaluation; None: the task's own (Task.best_metric).
    s.best_metric = placeholder(str)
    s.tokenizer = placeholder(str)  # None: the init checkpoint's (or its shard_dir's)
    return s


class Task(abc.ABC):
    """One task type. `settings` is the config's `task` section, as `settings()` defines it
    (for a fine-tuned model: that definition with what `task.json` kept of it)."""

    name: ClassVar[str]  # the value of task.type
    command: ClassVar[str]  # `python -m bertjax.predict COMMAND` for its models
    targets: ClassVar[tuple[str, ...]]  # feature arrays the loss reads
    best_metric: ClassVar[str]
    higher_is_better: ClassVar[tuple[str, ...]]  # what task.best_metric may name
    uses_labels: ClassVar[bool] = False  # a label vocabulary from the training set
    # Why batches may not be cut to their longest example (train.bucket_lengths), or "" when
    # they may: the loss ignores padding positions, so cutting them changes nothing.
    no_bucketing_because: ClassVar[str] = ""
    # Targets per example (from its pooled [CLS]) or per token, and a loss that sums over
    # them: training rows may hold several examples (train.examples_per_row, see
    # batching.pack_rows).
    packable: ClassVar[bool] = False
    # task.* keys a fine-tuned model keeps in task.json for prediction.
    saved_settings: ClassVar[tuple[str, ...]] = ("max_seq_length",)

    def __init__(self, settings: Any):
        self.settings = settings

    # --- settings ----------------------------------------------------------------------------

    @classmethod
    def settings(cls) -> ml_collections.ConfigDict:
        """The config's `task` section for this task, every key with its default: the keys
        every task reads (`data_settings`) and the task's own (`own_settings`)."""
        s = data_settings()
        s.type = cls.name
        for key, value in cls.own_settings().items():
            s[key] = value
        return s

    @classmethod
    def own_settings(cls) -> dict[str, Any]:
        """This task's keys of the `task` section with their defaults (placeholder(type) for
        a key whose None means "decide from the data"). The constructor validates them."""
        return {}

    # --- inputs ------------------------------------------------------------------------------

    @abc.abstractmethod
    def read(self, path: str, labelled: bool) -> list:
        """The examples of one file; `labelled=False` reads files to predict on."""

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list:
        raise ValueError(f"task.type {self.name} reads no TFDS dataset; set task.train_file")

    def label_vocab(self, train_examples: list) -> LabelVocab | None:
        """The label vocabulary of the training examples; None for tasks without one."""
        return None

    @abc.abstractmethod
    def featurize(self, examples: Sequence, tokenizer, labels: LabelVocab | None,
                  training: bool = False) -> Features:
        """Fixed-length arrays: INPUTS, the targets when the examples are labelled, and
        whatever maps rows back to examples."""

    @abc.abstractmethod
    def examples_from_texts(self, texts: Sequence[str], context: str = "") -> list:
        """`predict --text` inputs as examples."""

    # --- model and loss ----------------------------------------------------------------------

    @abc.abstractmethod
    def model(self, config, labels: LabelVocab | None):
        """The Linen module: BERT ('bert') plus this task's head."""

    def normalizer(self, batch: dict):
        """The whole batch's loss denominator: sequences (examples, in packed rows), unless
        the task says otherwise."""
        if EXAMPLE_WEIGHTS in batch:
            return jnp.sum(batch[EXAMPLE_WEIGHTS])
        return jnp.asarray(batch["input_ids"].shape[0], jnp.float32)

    @abc.abstractmethod
    def loss_sum(self, outputs, batch: dict):
        """The summed loss of a (micro-)batch."""

    def fetch(self, outputs):
        """What evaluation brings back to the host from the model's outputs."""
        return outputs

    def forward(self, module, variables: dict, batch: dict, **kwargs):
        """The model's outputs on a batch (training; evaluation through `infer`). A task
        whose model reads more than INPUTS (its targets, for teacher forcing) says so here."""
        packing = Packing.from_batch(batch)
        if packing is not None:  # packed rows: only a packable task's model takes them
            kwargs = {**kwargs, "packing": packing}
        return module.apply(variables, *(batch[k] for k in INPUTS), **kwargs)

    def infer(self, module, params, batch: dict):
        """What evaluation and prediction bring back from a batch of INPUTS (jitted): the
        deterministic outputs, fetched; a generating task decodes here."""
        return self.fetch(self.forward(module, {"params": params}, batch, deterministic=True))

    def warm_start(self, params: dict, checkpoint: dict) -> dict:
        """The starting parameters from the checkpoint's encoder (`bert`) and the fresh rest;
        `checkpoint` holds the checkpoint's other parameters by name (its heads). A task may
        initialise more of its model from them or from the encoder."""
        return params

    # --- evaluation and prediction -----------------------------------------------------------

    @abc.abstractmethod
    def evaluate(self, taskset: TaskSet, outputs, labels: LabelVocab | None
                 ) -> tuple[dict, list[dict]]:
        """(metrics, or {} for an unlabelled set; one prediction record per example)."""

    def extra_outputs(self, records: list[dict]) -> dict[str, Any]:
        """More files to write beside a set's predictions: {suffix: JSON object}."""
        return {}

    @abc.abstractmethod
    def format_record(self, record: dict) -> str:
        """A prediction record as `python -m bertjax.predict` prints it."""

    # --- data sets ---------------------------------------------------------------------------

    def read_training(self) -> list:
        """The training examples: task.train_file's, or the TFDS split's."""
        s = self.settings
        if s.tfds_name:
            if s.train_file:
                raise ValueError("set task.train_file or task.tfds_name, not both")
            return self.read_tfds(s.tfds_name, s.tfds_train_split, s.tfds_data_dir or None)
        if not s.train_file:
            raise ValueError("task.train_file is not set: set it (or task.tfds_name) to the "
                             "training data")
        return self.read(s.train_file, labelled=True)

    def load(self, tokenizer) -> TaskData:
        """Reads and featurizes the sets the settings name; the label vocabulary comes from
        the training set (an evaluation label it lacks is an error naming the file and line).
        """
        s = self.settings
        train_examples = self.read_training()
        if s.tfds_name:
            data_dir = s.tfds_data_dir or None
            eval_examples = [(split, self.read_tfds(s.tfds_name, split, data_dir))
                             for split in s.tfds_eval_splits]
        else:
            eval_examples = [(_name(p), self.read(p, labelled=True)) for p in s.eval_files]
        labels = self.label_vocab(train_examples)
        train = TaskSet("train", train_examples,
                        self.featurize(train_examples, tokenizer, labels, training=True), True)
        evals = [TaskSet(name, examples, self.featurize(examples, tokenizer, labels), True)
                 for name, examples in eval_examples]
        predicts = []
        for path in s.predict_files:
            examples = self.read(path, labelled=False)
            predicts.append(TaskSet(_name(path), examples,
                                    self.featurize(examples, tokenizer, labels), False))
        _check_unique_names(evals + predicts)
        return TaskData(train, evals, predicts, labels)

    # --- the exported model ------------------------------------------------------------------

    def save(self, directory: str, labels: LabelVocab | None) -> None:
        """What `from_model_directory` needs besides the model: task.json and labels.json."""
        files.write_json(os.path.join(directory, TASK_FILE), {"type": self.name, **self.saved()},
                         indent=1)
        if labels is not None:
            labels.save(directory)

    def saved(self) -> dict[str, Any]:
        """The settings task.json keeps: `saved_settings`, as this run used them."""
        return {k: self.settings[k] for k in self.saved_settings}

    @staticmethod
    def from_model_directory(directory: str) -> tuple["Task", LabelVocab | None]:
        path = files.path(directory) / TASK_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: {directory} is not a fine-tuned model "
                                    f"(fine-tuning exports one as WORKDIR/model)")
        kept = files.read_json(path)
        cls = get(kept.pop("type"))
        settings = cls.settings()
        for key, value in kept.items():
            if key not in settings:
                raise ValueError(f"{path}: {key!r} is not a setting of task.type {cls.name}")
            if value == "" and settings[key] is None:
                value = None  # written when unset settings were "" (before placeholders)
            settings[key] = tuple(value) if isinstance(value, list) else value
        return cls(settings), (LabelVocab.load(directory) if cls.uses_labels else None)


def _name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _check_unique_names(sets: list[TaskSet]) -> None:
    seen = set()
    for s in sets:
        if s.name in seen:
            raise ValueError(f"two evaluation/prediction sets are named {s.name!r}: their "
                             f"predictions files would collide; rename one file")
        seen.add(s.name)


def example_sum(values, batch: dict):
    """Per-example values summed over a batch; packed rows' empty slots weigh nothing."""
    if EXAMPLE_WEIGHTS in batch:
        return jnp.sum(values * batch[EXAMPLE_WEIGHTS])
    return jnp.sum(values)


# --- the registry --------------------------------------------------------------------------

_REGISTRY: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    if cls.name in _REGISTRY:
        raise ValueError(f"task type {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    """Imports every module of this package, so each task file registers itself."""
    package = importlib.import_module("bertjax.tasks")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"bertjax.tasks.{module.name}")


def names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get(name: str) -> type[Task]:
    _discover()
    if name not in _REGISTRY:
        raise ValueError(f"task.type {name!r}: expected one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
