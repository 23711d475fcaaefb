"""Chinese word segmentation end to end from raw text, beside dictionary maximum matching.

  PYTHONPATH=.:tests python benchmarks/segmentation_vs_max_match.py --out=/tmp/cwsbench

The corpus is HKCanCor (tests/real_data.py: conversational Cantonese in Chinese characters,
segmented by hand, CC BY 4.0, from the pycantonese 3.4.0 wheel; every tenth conversation is
the test set, never trained or pretrained on). The run is what a user does:

1. `prepare` trains a SentencePiece model on the raw (unsegmented) training utterances and
   writes shards;
2. `main` pretrains a small BERT (configs/tiny.py, shrunk by the flags below) on them;
3. `main` fine-tunes configs/finetune/segment.py from that pretraining workdir on the first
   --train segmented training utterances, and scores the first --held_out test utterances.

The baseline is forward maximum matching with a dictionary of the same training words. Both
are scored by the same code (word-level P/R/F1, tasks/metrics.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import real_data  # noqa: E402  (tests/: the CI tests' data builders)
from config_commands import parse  # noqa: E402


def running_text(words: list[str]) -> str:
    """The utterance as it is written: no space except between two words of spaced scripts."""
    from bertjax.tasks.features import written_unspaced
    out = words[0] if words else ""
    for a, b in zip(words, words[1:]):
        out += ("" if written_unspaced(a[-1]) or written_unspaced(b[0]) else " ") + b
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/cwsbench")
    parser.add_argument("--pretrain_steps", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--train", type=int, default=2000, help="fine-tuning utterances")
    parser.add_argument("--held_out", type=int, default=1000, help="test utterances scored")
    parser.add_argument("--epochs", type=float, default=10.0)  # 4: F1 0.837, 10: 0.862
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    args = parser.parse_args()
    rerun = ("PYTHONPATH=.:tests python benchmarks/segmentation_vs_max_match.py " + " ".join(
        f"--{k}={v}" for k, v in vars(args).items()))
    print(f"# {rerun}", flush=True)

    from bertjax import main as bertjax_main
    from bertjax.data import corpus as corpus_lib
    from bertjax.data import preparation
    from bertjax.tasks import metrics, tag_schemes

    os.makedirs(args.out, exist_ok=True)
    data = real_data.hkcancor()
    train, test = data["train"], data["test"][:args.held_out]
    seconds = {}
    start = time.perf_counter()
    source = os.path.join(args.out, "train-raw.jsonl")
    with open(source, "w", encoding="utf-8") as f:
        for i in range(0, len(train), 20):  # 20 utterances a document
            f.write(json.dumps({"text": "\n".join(map(running_text, train[i:i + 20]))},
                               ensure_ascii=False) + "\n")
    shards = os.path.join(args.out, "shards")
    preparation.prepare(corpus_lib.Corpus(source, "jsonl"), shards, vocab_size=3000,
                        num_shards=2, overwrite=True, quiet=True)
    seconds["prepare"] = time.perf_counter() - start

    start = time.perf_counter()
    pretrain = os.path.join(args.out, "pretrain")
    h = args.hidden
    config, workdir = parse([
        "--config=configs/tiny.py", f"--workdir={pretrain}", f"--config.data.shard_dir={shards}",
        f"--config.model.hidden_size={h}", "--config.model.num_hidden_layers=2",
        "--config.model.num_attention_heads=4", f"--config.model.intermediate_size={2 * h}",
        "--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=10",
        f"--config.train.num_steps={args.pretrain_steps}", "--config.train.log_every=50",
        f"--config.train.eval_every={args.pretrain_steps}", "--config.train.eval_batches=2",
        f"--config.train.checkpoint_every={args.pretrain_steps}", "--config.quiet=true"])
    if not os.path.exists(os.path.join(pretrain, "model")):
        bertjax_main.run_mode(config, workdir)
    seconds["pretrain"] = time.perf_counter() - start

    def write(name, utterances):
        path = os.path.join(args.out, name)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(" ".join(u) + "\n" for u in utterances)
        return path

    start = time.perf_counter()
    finetune = os.path.join(args.out, "segment")
    config, workdir = parse([
        "--config=configs/finetune/segment.py", f"--workdir={finetune}",
        f"--config.init_checkpoint={pretrain}",
        f"--config.task.train_file={write('train.txt', train[:args.train])}",
        f"--config.task.eval_files={write('test.txt', test)}",
        "--config.task.max_seq_length=48", "--config.task.doc_stride=16",
        "--config.optimizer.name=adamw", "--config.optimizer.schedule=warmup_linear",
        f"--config.optimizer.learning_rate={args.learning_rate}",
        f"--config.train.num_epochs={args.epochs}", "--config.quiet=true"])
    if os.path.exists(finetune):  # a finished run would only be re-reported
        import shutil
        shutil.rmtree(finetune)
    bertjax_main.run_mode(config, workdir)
    seconds["finetune"] = time.perf_counter() - start
    with open(os.path.join(finetune, "eval_results.json")) as f:
        bertjax_scores = json.load(f)["sets"]["test"]["final"]["metrics"]

    dictionary = {w for u in train[:args.train] for w in u}
    longest = max(map(len, dictionary))
    gold = [tag_schemes.segmentation_tags(map(len, u)) for u in test]
    matched = [tag_schemes.segmentation_tags(map(len, real_data.max_match(
        "".join(u), dictionary, longest))) for u in test]
    baseline = metrics.word_scores(gold, matched, dictionary, [list("".join(u)) for u in test])
    report = {"rerun": rerun, "seconds": seconds, "bertjax": bertjax_scores,
              "max_match": baseline}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    for name, scores in (("bertjax", bertjax_scores), ("maximum matching", baseline)):
        print(f"{name}: word P {scores['precision']:.3f} R {scores['recall']:.3f} "
              f"F1 {scores['f1']:.3f}, OOV recall {scores['oov_recall']:.3f}")
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))


if __name__ == "__main__":
    main()
