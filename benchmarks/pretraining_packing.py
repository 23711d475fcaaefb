"""Real tokens per row of pretraining batches, one example a row (the original) against packed
rows (`data.examples_per_row`), on the embedded Austen corpus (long chapters) and on HKCanCor
(conversational Cantonese, 20 short utterances a document: benchmarks/real_data.py).

  python -m benchmarks.pretraining_packing
  python -m benchmarks.pretraining_packing --rows=4096 --per_row=8

Each corpus is prepared as `python -m bertjax.prepare` does it (a SentencePiece model trained
on it), and the first --rows rows of the training pipeline are read at each sequence length,
with the default recipe (NSP on, 10% short targets). The share is real tokens over row
positions; packed, the rows also hold fewer predictions per slot than they could, so the
prediction slots filled are shown too.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from benchmarks import harness

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def prepared(name: str, out: str) -> str:
    from bertjax.data import corpus as corpus_lib
    from bertjax.data import preparation
    directory = os.path.join(out, name)
    if name == "austen":
        source = corpus_lib.Corpus()  # the embedded corpus
    else:
        from benchmarks import cantonese_bert, real_data
        path = os.path.join(out, "hkcancor.jsonl")
        utterances = real_data.hkcancor()["train"]
        step = cantonese_bert.UTTERANCES_PER_DOCUMENT
        with open(path, "w", encoding="utf-8") as f:
            for i in range(0, len(utterances), step):
                text = "\n".join(map(cantonese_bert.running_text, utterances[i:i + step]))
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        source = corpus_lib.Corpus(path, "jsonl")
    preparation.prepare(source, directory, vocab_size=8000 if name == "austen" else 3000,
                        num_shards=2, quiet=True)
    return directory


def shares(directory: str, seq_len: int, per_row: int, rows: int) -> dict:
    from bertjax.data import pretraining, tokenizers
    vocab = pretraining.Vocab.from_tokenizer(tokenizers.load_tokenizer(directory))
    predictions = max(1, round(0.15 * seq_len))
    it = pretraining.pretraining_dataset(
        directory, vocab=vocab, max_seq_length=seq_len, max_predictions_per_seq=predictions,
        global_batch_size=256, seed=0, examples_per_row=per_row)
    start = time.perf_counter()
    batches = [next(it) for _ in range(max(1, rows // 256))]
    seconds = time.perf_counter() - start
    mask = np.concatenate([b["input_mask"] for b in batches])
    weights = np.concatenate([b["masked_lm_weights"] for b in batches])
    examples = (np.concatenate([b["example_weights"] for b in batches]).sum()
                if per_row > 1 else len(mask))
    return {"real_tokens_per_row": float(mask.mean()), "examples_per_row": examples / len(mask),
            "prediction_slots_filled": float((weights > 0).mean()),
            "rows_per_second": len(mask) / seconds}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--out", default="/tmp/packbench", help="the prepared corpora")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--per_row", type=int, default=8, help="examples_per_row when packed")
    parser.add_argument("--seq_lengths", default="128,512")
    args = parser.parse_args()
    bench = harness.start(args)
    table = bench.table(
        f"the first {args.rows} rows, one example a row against up to {args.per_row} packed",
        [("corpus", ""), ("seq", "d"), ("real tokens per row: one example", ".3f"),
         ("packed", ".3f"), ("examples per row packed", ".2f"),
         ("prediction slots filled packed", ".3f"), ("rows/s one", ".0f"),
         ("rows/s packed", ".0f")])
    for name in ("austen", "hkcancor"):
        directory = prepared(name, args.out)
        for seq_len in map(int, args.seq_lengths.split(",")):
            one = shares(directory, seq_len, 1, args.rows)
            packed = shares(directory, seq_len, args.per_row, args.rows)
            table.row(name, seq_len, one["real_tokens_per_row"], packed["real_tokens_per_row"],
                      packed["examples_per_row"], packed["prediction_slots_filled"],
                      one["rows_per_second"], packed["rows_per_second"])
    bench.finish()


if __name__ == "__main__":
    main()
