"""Golden runs: small but complete `python -m bertjax.main` runs whose every logged figure is
committed in tests/golden/figures.json, so a change that was meant to alter no behaviour (a
refactor, a move, a rename) is checked to alter none, bit for bit.

The runs: pretraining of a 1-layer model on Austen text for 60 steps with checkpoints every
20, evaluation every 30, then the last checkpoint removed and the same command run again (a
resume from step 40 must give the same figures); and one fine-tuning run per task family
(classification, pair regression, tagging, extractive QA) from a tiny random BERT.

    PYTHONPATH=.:tests .venv/bin/python tests/golden_runs.py --record

records the figures afresh (after a change that is *meant* to change them; say why in the
commit). Floats are stored exactly (JSON keeps a float's shortest repr).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "tests", "golden", "figures.json")
TIMING = ("seq_per_sec", "mfu")  # wall-clock figures, different at every run

PRETRAIN_ARGS = [
    "--config=configs/tiny.py",
    "--config.model.num_hidden_layers=1", "--config.model.hidden_size=32",
    "--config.model.num_attention_heads=2", "--config.model.intermediate_size=37",
    "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
    "--config.data.heldout_fraction=0.1", "--config.train.global_batch_size=16",
    "--config.train.num_steps=60", "--config.train.log_every=10",
    "--config.train.eval_every=30", "--config.train.eval_batches=2",
    "--config.train.checkpoint_every=20", "--config.train.peak_flops_per_device=1e9",
    "--config.quiet=true",
]
FINETUNE_ARGS = [
    "--config.task.max_seq_length=24", "--config.train.global_batch_size=16",
    "--config.train.eval_batch_size=16", "--config.train.num_epochs=2",
    "--config.train.log_every=1", "--config.optimizer.learning_rate=1e-3",
    "--config.quiet=true",
]
# name -> (config file, extra arguments)
FINETUNE_RUNS = {
    "classification": ("configs/finetune/classify.py", []),
    "regression": ("configs/finetune/pair.py", ["--config.task.type=regression"]),
    "tagging": ("configs/finetune/tag.py", ["--config.task.doc_stride=12"]),
    "squad": ("configs/finetune/squad.py", ["--config.task.doc_stride=12",
                                            "--config.task.max_query_length=8"]),
}


def machine() -> str:
    """What decides the exact float results: XLA's CPU code differs by instruction set."""
    model = platform.processor() or platform.machine()
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = " ".join(sorted(set(line.split(":", 1)[1].split())
                                            & {"avx2", "avx512f", "avx512_bf16", "amx_tile"}))
    return f"{model} [{flags}]"


def _records(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _run(args: list[str]) -> None:
    from config_commands import parse
    from bertjax import main
    config, workdir = parse(args)
    main.run_mode(config, workdir)


def pretraining_corpus(directory: str) -> str:
    """40 documents of 12 Austen paragraphs each, tokenized with the real WordPiece vocab."""
    from bertjax.data import corpus as corpus_lib
    from bertjax.data import preparation
    from benchmarks.task_data import MINILM_DIR, austen_paragraphs
    os.makedirs(directory, exist_ok=True)
    source = os.path.join(directory, "austen.jsonl")
    paragraphs = austen_paragraphs()[:480]
    with open(source, "w", encoding="utf-8") as f:
        for d in range(40):
            f.write(json.dumps({"text": "\n".join(paragraphs[12 * d:12 * d + 12])}) + "\n")
    shards = os.path.join(directory, "shards")
    preparation.prepare(corpus_lib.Corpus(source, "jsonl"), shards,
                        tokenizer=os.path.join(MINILM_DIR, "vocab.txt"), num_shards=2,
                        quiet=True)
    return shards


def pretraining(directory: str) -> dict:
    """Figures of the pretraining run, and of the same run resumed from step 40."""
    shards = pretraining_corpus(os.path.join(directory, "corpus"))
    workdir = os.path.join(directory, "pretrain")
    args = [*PRETRAIN_ARGS, f"--workdir={workdir}", f"--config.data.shard_dir={shards}"]
    _run(args)
    full = _records(workdir)
    # As if the run had died after saving step 40: the later checkpoint and the export gone.
    shutil.rmtree(os.path.join(workdir, "checkpoints", "60"))
    shutil.rmtree(os.path.join(workdir, "model"))
    _run(args)
    return {"metrics": full, "resumed_metrics": _records(workdir)}


def finetuning_files(directory: str, task: str) -> tuple[str, str]:
    """(train file, eval file) for a task family, made from Austen text."""
    from benchmarks import real_data
    from finetune_helpers import sentences, write_tsv
    os.makedirs(directory, exist_ok=True)
    train, dev = os.path.join(directory, f"{task}-train"), os.path.join(directory, f"{task}-dev")
    if task == "squad":
        questions = real_data.austen_questions()
        return (real_data.write_squad(train + ".json", questions[:48]),
                real_data.write_squad(dev + ".json", questions[48:72]))
    texts = sentences(72)
    if task == "tagging":
        for path, part in ((train, texts[:48]), (dev, texts[48:])):
            with open(path + ".txt", "w", encoding="utf-8") as f:
                for text in part:
                    f.writelines(f"{w} {'B-NAME' if w[:1].isupper() else 'O'}\n"
                                 for w in text.split())
                    f.write("\n")
        return train + ".txt", dev + ".txt"
    if task == "regression":
        rows = [(t, texts[(i + 1) % len(texts)], len(t) / 20) for i, t in enumerate(texts)]
        header = ("sentence1", "sentence2", "label")
    else:
        rows = [(t, "long" if len(t) > 50 else "short") for t in texts]
        header = ("sentence", "label")
    return (write_tsv(train + ".tsv", rows[:48], header),
            write_tsv(dev + ".tsv", rows[48:], header))


def finetuning(directory: str, task: str, model_dir: str) -> dict:
    config_file, extra = FINETUNE_RUNS[task]
    train, dev = finetuning_files(os.path.join(directory, "data"), task)
    workdir = os.path.join(directory, task)
    _run([f"--config={config_file}", f"--workdir={workdir}",
          f"--config.init_checkpoint={model_dir}", f"--config.task.train_file={train}",
          f"--config.task.eval_files={dev}", *FINETUNE_ARGS, *extra])
    with open(os.path.join(workdir, "eval_results.json")) as f:
        results = json.load(f)
    predictions = os.path.join(workdir, "predictions")
    return {"metrics": _records(workdir),
            "results": {name: s["final"]["metrics"] for name, s in results["sets"].items()},
            "predictions": {name: _digest(os.path.join(predictions, name))
                            for name in sorted(os.listdir(predictions))}}


def all_figures(directory: str) -> dict:
    from finetune_helpers import tiny_model_dir
    model_dir = tiny_model_dir(os.path.join(directory, "tiny-model"))
    return {"machine": machine(), "pretraining": pretraining(directory),
            "finetuning": {task: finetuning(directory, task, model_dir)
                           for task in FINETUNE_RUNS}}


def main() -> None:
    import tempfile
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: PYTHONPATH=.:tests {sys.argv[0]} --record")
    os.chdir(ROOT)
    import conftest  # noqa: F401  (8 CPU devices, as the tests run)
    with tempfile.TemporaryDirectory() as directory:
        figures = all_figures(directory)
    os.makedirs(os.path.dirname(FIGURES), exist_ok=True)
    with open(FIGURES, "w") as f:
        json.dump(figures, f, indent=1)
        f.write("\n")
    print(f"wrote {FIGURES}")


if __name__ == "__main__":
    main()
