"""What do pretrained features know of sentiment? Linear probes and word neighbours for the two
models a `pretrain_then_finetune.py` run leaves (OUT/pretrain/model, OUT/random_init/model).

    python -m benchmarks.sentiment_probe --out=/tmp/ptf-imdb --held_out=2000 \
        --train_examples=500,8000

- Linear probes: the encoder frozen, a logistic regression (scikit-learn) on three features
  of each VADER movie-review snippet (the benchmark's split: the same held-out snippets),
  standardised on the training set: the mean of the last layer over the real tokens, the
  pooled `[CLS]`, and the mean of the word embeddings alone.
- Neighbours: the five nearest pieces (cosine of the word embeddings) of evaluative words,
  and cos(good, bad). Masked LM learns which words fill the same slots; whether it separates
  "good" from "bad" is what sentiment needs.
"""

from __future__ import annotations

import csv
import dataclasses
import os

import numpy as np

from benchmarks import harness, real_tasks

SENTIMENT = real_tasks.PRETRAIN_THEN_FINETUNE_TASKS["sentiment"]

WORDS = ("good", "bad", "great", "awful", "boring", "brilliant", "worst", "best")
MAX_LENGTH = 48


def read_tsv(path: str) -> tuple[list[str], np.ndarray]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [r["sentence"] for r in rows], np.array([r["label"] == "positive" for r in rows])


class Encoder:
    """A model directory's encoder, frozen, and its tokenizer."""

    def __init__(self, model_dir: str):
        import jax

        from bertjax.data.tokenizers import load_tokenizer
        from bertjax.models.bert import BertModel
        from bertjax.training import checkpoints

        config, params = checkpoints.load_model(model_dir)
        self.params = params["bert"]
        self.tokenizer = load_tokenizer(checkpoints.open_model(model_dir).tokenizer_dir)
        self.embeddings = np.asarray(self.params["embeddings"]["word_embeddings"]["embedding"])
        module = BertModel(config)
        self._apply = jax.jit(lambda p, ids, mask: module.apply(
            {"params": p}, ids, mask, jax.numpy.zeros_like(ids), True))

    def features(self, texts: list[str], batch: int = 256) -> dict[str, np.ndarray]:
        tok = self.tokenizer
        out: dict[str, list] = {"last layer, mean": [], "pooled [CLS]": [],
                                "word embeddings, mean": []}
        for start in range(0, len(texts), batch):
            rows = [[tok.cls_id] + tok.encode(t)[:MAX_LENGTH - 2] + [tok.sep_id]
                    for t in texts[start:start + batch]]
            ids = np.zeros((len(rows), MAX_LENGTH), np.int32)
            for i, row in enumerate(rows):
                ids[i, :len(row)] = row
            mask = (ids > 0).astype(np.int32)[..., None]
            x_BLD, pooled_BD = self._apply(self.params, ids, mask[..., 0])
            out["last layer, mean"].append((np.asarray(x_BLD) * mask).sum(1) / mask.sum(1))
            out["pooled [CLS]"].append(np.asarray(pooled_BD))
            out["word embeddings, mean"].append((self.embeddings[ids] * mask).sum(1)
                                                / mask.sum(1))
        return {k: np.concatenate(v) for k, v in out.items()}

    def neighbours(self, word: str, count: int = 5) -> list[str] | None:
        ids = self.tokenizer.encode(" " + word)
        if len(ids) != 1:
            return None
        unit = self.embeddings / np.linalg.norm(self.embeddings, axis=1, keepdims=True)
        order = np.argsort(-(unit @ unit[ids[0]]))
        return [self.tokenizer.decode([int(i)]).strip() for i in order[1:count + 1]]

    def cosine(self, a: str, b: str) -> float:
        (i,), (j,) = self.tokenizer.encode(" " + a), self.tokenizer.encode(" " + b)
        u, v = self.embeddings[i], self.embeddings[j]
        return float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))


def probe(train: np.ndarray, y_train: np.ndarray, test: np.ndarray, y_test: np.ndarray) -> float:
    from sklearn.linear_model import LogisticRegression
    mean, std = train.mean(0), train.std(0) + 1e-6
    model = LogisticRegression(max_iter=2000).fit((train - mean) / std, y_train)
    return float(model.score((test - mean) / std, y_test))


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--out", required=True, help="a pretrain_then_finetune.py --out")
    parser.add_argument("--held_out", type=int, default=SENTIMENT.held_out,
                        help="the run's --held_out=sentiment=N")
    parser.add_argument("--train_examples", default="500,8000")
    args = parser.parse_args()
    sizes = [int(n) for n in args.train_examples.split(",")]
    bench = harness.start(args)
    task = dataclasses.replace(SENTIMENT, train=max(sizes), held_out=args.held_out)
    train_file, eval_file, _ = real_tasks.write_data("sentiment", task,
                                                     os.path.join(args.out, "probe-data"))
    train, y_train = read_tsv(train_file)
    test, y_test = read_tsv(eval_file)
    probes, near_rows = None, []
    for name in ("pretrain", "random_init"):
        encoder = Encoder(os.path.join(args.out, name, "model"))
        train_features, test_features = encoder.features(train), encoder.features(test)
        if probes is None:
            probes = bench.table(f"linear probes, accuracy on {len(test)} held-out snippets",
                                 [("model", ""), ("training snippets", ",d")]
                                 + [(k, ".3f") for k in train_features])
        for n in sizes:
            probes.row(name, n, *(probe(train_features[k][:n], y_train[:n], test_features[k],
                                        y_test) for k in train_features))
        near_rows.append((name, "cos(good, bad)", f"{encoder.cosine('good', 'bad'):.2f}"))
        for word in WORDS:
            near = encoder.neighbours(word)
            near_rows.append((name, word, " ".join(near) if near else "(several pieces)"))
    neighbours = bench.table("the five nearest pieces by the cosine of word embeddings",
                             [("model", ""), ("word", ""), ("neighbours", "")])
    for row in near_rows:
        neighbours.row(*row)
    bench.finish()


if __name__ == "__main__":
    main()
