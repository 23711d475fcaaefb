"""The real fine-tuning tasks the benchmarks share: each task's data written to files with a
fixed train / held-out split, its trivial baseline on the held-out set, and the bertjax
command that fine-tunes on it; and the Cantonese transcription task of the generation
benchmarks. The data come from benchmarks/real_data.py, built by the same code as the tests'.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys

import numpy as np

from benchmarks import cantonese_bert, real_data

DATA_SEED = 0  # the train / held-out split; --seed is the training run's


@dataclasses.dataclass
class Task:
    config: str  # configs/finetune/<config>.py
    type: str
    train: int  # training examples
    held_out: int
    max_seq_length: int
    learning_rate: float
    epochs: float
    metrics: tuple[str, ...]  # shown in the table, the first one headlines
    head_lr_multiplier: float = 1.0
    overrides: dict = dataclasses.field(default_factory=dict)
    model: str = "minilm"  # or "cantonese": the BERT bertjax pretrains on HKCanCor's raw text


# pretrain_then_finetune.py's (and sentiment_probe.py's), the same for both initialisations:
# a model this small fine-tunes best at a rate well above
# BERT-base's 5e-5; tagging's fresh 21-way head learns at 10x that.
PRETRAIN_THEN_FINETUNE_TASKS = {
    "sentiment": Task("classify", "classification", 2000, 500, 48, 5e-4, 3.0,
                      ("accuracy", "macro_f1")),
    "tagging": Task("tag", "tagging", 0, 500, 48, 5e-4, 5.0,
                    ("f1", "precision", "recall"), head_lr_multiplier=10.0),
}

# --full trains on every example not held out; the pair task is generated, this many pairs.
FULL_PAIRS = 4000


# --- data --------------------------------------------------------------------------------------


def split(rows: list, train: int, held_out: int) -> tuple[list, list]:
    """The held-out rows are the same whatever `train` is (0: every row not held out)."""
    train = train or len(rows) - held_out
    if train + held_out > len(rows):
        raise ValueError(f"asked for {train} + {held_out} examples, the source has {len(rows)}")
    order = np.random.default_rng(DATA_SEED).permutation(len(rows))
    return [rows[i] for i in order[:train]], [rows[i] for i in order[-held_out:]]


def write_tsv(path: str, rows: list[tuple], header: tuple) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        f.writelines("\t".join(map(str, r)) + "\n" for r in rows)
    return path


def write_data(name: str, task: Task, directory: str) -> tuple[str, str, dict]:
    """(train file, held-out file, the trivial baseline's metrics on the held-out set)."""
    os.makedirs(directory, exist_ok=True)
    train_path, dev_path = (os.path.join(directory, f) for f in ("train", "dev"))
    if name == "sentiment":
        rows = [(text, "positive" if score > 0 else "negative")
                for text, score in real_data.vader_movie_snippets() if score != 0]
        train, dev = split(rows, task.train, task.held_out)
        header = ("sentence", "label")
        majority = collections.Counter(l for _, l in train).most_common(1)[0][0]
        baseline = {"train_examples": len(train), "name": f"always {majority!r}",
                    "accuracy": float(np.mean([l == majority for _, l in dev]))}
        return (write_tsv(train_path + ".tsv", train, header),
                write_tsv(dev_path + ".tsv", dev, header), baseline)
    if name == "tagging":
        tweets = [t for t in real_data.wnut16_lines().split("\n\t\n") if t.strip()]
        train, dev = split(tweets, task.train, task.held_out)
        # A tag the training split never shows cannot be learnt (and bertjax rejects it):
        # such held-out tweets are left out, the same for both frameworks.
        def tags(tweet):
            return {line.split("\t")[1] for line in tweet.splitlines() if line.strip()}
        known = set().union(*map(tags, train))
        kept = [t for t in dev if tags(t) <= known]
        if len(kept) < len(dev):
            unknown = ", ".join(sorted(set().union(*map(tags, dev)) - known))
            print(f"tagging: {len(dev) - len(kept)} of {len(dev)} held-out tweets have tags the "
                  f"training split lacks ({unknown}); left out", flush=True)
        dev = kept
        for path, part in ((train_path, train), (dev_path, dev)):
            with open(path + ".txt", "w", encoding="utf-8") as f:
                f.write("\n\t\n".join(part))
        gold = [line.split("\t")[1] for t in dev for line in t.splitlines() if line.strip()]
        baseline = {"train_examples": len(train), "name": "every word O", "f1": 0.0,
                    "held_out_kept": len(dev),
                    "token_accuracy": float(np.mean([t == "O" for t in gold]))}
        return train_path + ".txt", dev_path + ".txt", baseline
    if name == "pair":
        train, dev = split(real_data.austen_pairs((task.train or FULL_PAIRS) + task.held_out,
                                                  seed=DATA_SEED), task.train, task.held_out)
        header = ("sentence1", "sentence2", "label")
        mean = float(np.mean([s for *_, s in train]))
        gold = np.array([s for *_, s in dev])
        baseline = {"train_examples": len(train), "name": "the training mean",
                    "pearson": 0.0, "spearman": 0.0, "mse": float(np.mean((gold - mean) ** 2))}
        return (write_tsv(train_path + ".tsv", train, header),
                write_tsv(dev_path + ".tsv", dev, header), baseline)
    if name == "qa":
        train, dev = split(real_data.austen_questions(), task.train, task.held_out)
        common = collections.Counter(e.answer_text for e in train).most_common(1)[0][0]
        baseline = {"train_examples": len(train), "name": f"always {common!r}",
                    "exact": float(100 * np.mean([common in e.answers for e in dev]))}
        return (real_data.write_squad(train_path + ".json", train),
                real_data.write_squad(dev_path + ".json", dev), baseline)
    if name == "segmentation":
        data = real_data.hkcancor()
        train, test = data["train"][:task.train or None], data["test"][:task.held_out]
        baseline = {"train_examples": len(train), "name": "dictionary maximum matching",
                    **real_data.max_match_scores(train, test)}
        return (cantonese_bert.write_segmented(train_path + ".txt", train),
                cantonese_bert.write_segmented(dev_path + ".txt", test), baseline)
    if name.startswith("pos"):
        data = real_data.hkcancor_pos()
        train, test = data["train"][:task.train or None], data["test"]
        known = {t for _, tags in train for t in tags}
        kept = [(w, t) for w, t in test if set(t) <= known][:task.held_out]
        print(f"pos: {len(test) - len([1 for _, t in test if set(t) <= known])} of {len(test)} "
              "test utterances have tags the training split lacks; left out", flush=True)
        accuracy, overall = real_data.most_frequent_tag(train, kept)
        baseline = {"train_examples": len(train), "held_out_kept": len(kept),
                    "name": f"each word's most frequent training tag (unseen: {overall!r})",
                    "token_accuracy": accuracy}
        return (cantonese_bert.write_tagged(train_path + ".conll", train),
                cantonese_bert.write_tagged(dev_path + ".conll", kept), baseline)
    raise ValueError(f"unknown task {name!r}: expected sentiment, tagging, pair, qa, "
                     "segmentation or pos (pos_head10 and the like)")


# --- the bertjax run ---------------------------------------------------------------------------


# --padding=dynamic: bertjax cuts each batch to the shortest of these that holds it.
BUCKET_LENGTHS = (16, 32, 48, 64, 96, 128, 256)


# Examples a training step takes (--padding=packed: on average).
EXAMPLES_PER_STEP = 32


def cuts(task: Task, padding: str) -> bool:
    """Whether batches are cut to length (with --padding=packed, bertjax's evaluation
    batches: its training rows are full). QA's span softmax runs over every position, padding
    included (in both frameworks), so cutting its rows would change the loss: never."""
    return padding in ("dynamic", "packed") and task.type != "squad"


def overrides(task: Task, model_dir: str, train_file: str, eval_file: str, seed: int,
              padding: str) -> dict:
    """Every --config.KEY=VALUE of the bertjax run; the PyTorch run reads the same values
    (with --padding=packed, the bertjax run's packing is added by main)."""
    buckets = tuple(b for b in BUCKET_LENGTHS if b < task.max_seq_length)
    return {**({"train.bucket_lengths": buckets} if cuts(task, padding) else {}),
            "init_checkpoint": model_dir, "task.train_file": train_file,
            "task.eval_files": eval_file,
            "task.max_seq_length": task.max_seq_length, **task.overrides,
            "optimizer.name": "adamw", "optimizer.schedule": "warmup_linear",
            "optimizer.learning_rate": task.learning_rate,
            **({"optimizer.head_lr_multiplier": task.head_lr_multiplier}
               if task.head_lr_multiplier != 1.0 else {}),
            "train.num_epochs": task.epochs, "train.global_batch_size": EXAMPLES_PER_STEP,
            "train.eval_batch_size": 64, "seed": seed}


def bertjax_command(task: Task, workdir: str, values: dict) -> list[str]:
    """`python -m bertjax.main` with the task's config and `values` as overrides."""
    return ([sys.executable, "-m", "bertjax.main",
             f"--config=configs/finetune/{task.config}.py", f"--workdir={workdir}"]
            + [f"--config.{k}={x}" for k, v in values.items()
               for x in (v if isinstance(v, tuple) else (v,))])  # a tuple: the flag repeated


# --- Cantonese transcription (generation) -------------------------------------------------------


def transcription_files(out: str, train: int, test: int) -> tuple[str, str, list, list]:
    """(train file, held-out file, their rows): the first `train` and `test` HKCanCor
    utterances to Jyutping of each split (real_data.hkcancor_jyutping), as source / target
    TSV files under `out`."""
    data = real_data.hkcancor_jyutping()
    rows = data["train"][:train], data["test"][:test]
    files = [write_tsv(os.path.join(out, name), part, ("source", "target"))
             for name, part in zip(("train.tsv", "dev.tsv"), rows, strict=True)]
    return files[0], files[1], rows[0], rows[1]


def transcription_config(model_dir: str, train_file: str, dev_file: str, type: str, **task):
    """A fine-tuning config of task `type` (seq2seq, unilm) for the transcription task from
    `model_dir`: 16 source and 32 target pieces, greedy decoding, bias-corrected AdamW with
    linear warmup and decay, the rest the fine-tuning defaults (the generation benchmarks set
    their budget on top)."""
    from bertjax.training import finetune_config
    config = finetune_config.defaults(type)
    config.init_checkpoint = model_dir
    config.quiet = True
    config.optimizer.name = "adamw"
    config.optimizer.schedule = "warmup_linear"
    settings = {"text_columns": "source", "label_column": "target", "train_file": train_file,
                "eval_files": dev_file, "max_seq_length": 16, "max_target_length": 32,
                "num_beams": 1, **task}
    for key, value in settings.items():
        if isinstance(config.task[key], tuple) and isinstance(value, str):
            value = tuple(v for v in value.split(",") if v)  # files or columns, as a tuple
        config.task[key] = value
    return config
