"""`python -m bertjax.predict TASK`: predictions from a trained model.

  python -m bertjax.predict fill-mask --checkpoint=/tmp/bertjax-demo/run/model \\
      --text="It is a truth universally [MASK] that a single man in possession of a good \\
fortune must be in want of a wife."

fill-mask prints the `--top_k` most likely tokens, with probabilities, for every [MASK] of
every `--text`. `--checkpoint` is a model directory (what pretraining exports as
WORKDIR/model, or what `python -m bertjax.convert` writes) or a pretraining workdir.

Fine-tuned models (`--checkpoint` is the fine-tuning WORKDIR or its WORKDIR/model):

  python -m bertjax.predict classify --checkpoint=/tmp/sst2 --text="A gorgeous, witty film."
  python -m bertjax.predict tag --checkpoint=/tmp/ner --text="Emma walked to Highbury"
  python -m bertjax.predict qa --checkpoint=/tmp/squad --text="Who walked?" \\
      --context="Emma walked to Highbury."
  python -m bertjax.predict classify --checkpoint=/tmp/sst2 --input=test.tsv --output=p.jsonl

`classify` gives the label and its probability (or the score of a regression model; a TAB in
`--text` separates a sentence pair), `tag` a tag per word, `qa` the answer span (empty: no
answer). `--input` reads a file laid out like the training data (TSV/CSV/JSONL with
`--text_columns`, CoNLL, or SQuAD JSON); `--output` writes one JSON record per example.
"""

from __future__ import annotations

import json
import os
import sys

# TensorFlow (the input pipeline, TensorBoard files) would print its C++ info lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Model directory or pretraining workdir.")
_TEXT = flags.DEFINE_multi_string(
    "text", [], "Input text, repeatable: with [MASK]s (fill-mask), a sentence or TAB-separated "
    "pair (classify), words (tag), a question (qa).")
_TOP_K = flags.DEFINE_integer("top_k", 5, "Predictions shown per [MASK].")
_CONTEXT = flags.DEFINE_string("context", "", "qa: the passage that answers the questions.")
_INPUT = flags.DEFINE_string("input", "", "A file to predict on, laid out like training data.")
_OUTPUT = flags.DEFINE_string("output", "", "Write one JSON record per example here.")
_TEXT_COLUMNS = flags.DEFINE_string("text_columns", "sentence",
                                    "--input TSV/CSV/JSONL: comma-separated text columns.")
_FORMAT = flags.DEFINE_string("format", "", "--input format (tsv, csv, jsonl, conll, squad); "
                              "'' tells it from the model's task and the extension.")

MASK = "[MASK]"


def model_directory(path: str) -> str:
    """A pretraining workdir stands for the model it exported."""
    from etils import epath
    if not (epath.Path(path) / "config.json").exists() and (epath.Path(path) / "model").is_dir():
        return os.path.join(path, "model")
    return path


def encode_masked(tokenizer, text: str, max_length: int) -> tuple[list[int], list[int]]:
    """[CLS] text [SEP] with every literal [MASK] as the mask token; (ids, mask positions)."""
    pieces = text.split(MASK)
    if len(pieces) < 2:
        raise ValueError(f"--text {text!r} has no {MASK} to fill")
    ids = [tokenizer.cls_id]
    positions = []
    for i, piece in enumerate(pieces):
        if i:
            positions.append(len(ids))
            ids.append(tokenizer.mask_id)
        ids += tokenizer.encode(piece) if piece.strip() else []
    ids.append(tokenizer.sep_id)
    if len(ids) > max_length:
        raise ValueError(f"--text {text[:40]!r}... is {len(ids)} tokens with [CLS] and [SEP]; "
                         f"the model takes at most {max_length}")
    return ids, positions


def fill_mask(directory: str, texts: list[str], top_k: int) -> list[list[list[tuple[str, float]]]]:
    """For each text, for each [MASK]: the top_k (token, probability) pairs."""
    import jax
    import numpy as np

    from bertjax.data.tokenizers import load_tokenizer
    from bertjax.models.heads import BertForPreTraining
    from bertjax.training import checkpoints

    directory = model_directory(directory)
    config, params = checkpoints.load_model(directory)
    tokenizer = load_tokenizer(directory)
    model = BertForPreTraining(config)
    apply = jax.jit(lambda p, *args: model.apply({"params": p}, *args, deterministic=True))
    results = []
    for text in texts:
        ids, positions = encode_masked(tokenizer, text, config.max_position_embeddings)
        ids_BL = np.asarray([ids], np.int32)
        out = apply(params, ids_BL, np.ones_like(ids_BL), np.zeros_like(ids_BL),
                    np.asarray([positions], np.int32))
        probs_PV = np.asarray(jax.nn.softmax(out["mlm_logits"][0], axis=-1))
        results.append([
            [(tokenizer.decode([int(t)]).strip() or tokenizer.id_to_token(int(t)),
              float(probs_V[t])) for t in np.argsort(-probs_V)[:top_k]]
            for probs_V in probs_PV])
    return results


def fill_mask_main() -> None:
    if not _CHECKPOINT.value or not _TEXT.value:
        raise app.UsageError("fill-mask needs --checkpoint and at least one --text")
    for text, masks in zip(_TEXT.value, fill_mask(_CHECKPOINT.value, _TEXT.value,
                                                   _TOP_K.value)):
        print(text)
        for i, candidates in enumerate(masks, 1):
            shown = ", ".join(f"{token} {p:.3f}" for token, p in candidates)
            print(f"  [MASK] {i}: {shown}" if len(masks) > 1 else f"  [MASK]: {shown}")


# What each fine-tuned command accepts (task.json's type).
TASK_COMMANDS = {"classify": ("classification", "regression"), "tag": ("tagging",),
                 "qa": ("squad",)}


def _task_line(record: dict) -> str:
    if "words" in record:
        return " ".join(f"{w}/{t}" for w, t in zip(record["words"], record["predictions"]))
    if "question" in record:
        best = record["nbest"][0]["probability"] if record["nbest"] else 0.0
        answer = record["prediction"] or "(no answer)"
        return f"{record['question']}\n  {answer}  {best:.3f}"
    text = record["text_a"] + (f" | {record['text_b']}" if "text_b" in record else "")
    if "probability" in record:
        return f"{record['prediction']}  {record['probability']:.3f}  {text}"
    return f"{record['prediction']:.4f}  {text}"


def task_main(command: str) -> None:
    from bertjax.training.task_predict import TaskPredictor

    if not _CHECKPOINT.value or not (_TEXT.value or _INPUT.value):
        raise app.UsageError(f"{command} needs --checkpoint and --text or --input")
    predictor = TaskPredictor(model_directory(_CHECKPOINT.value))
    if predictor.task.type not in TASK_COMMANDS[command]:
        fits = next(c for c, types in TASK_COMMANDS.items() if predictor.task.type in types)
        raise ValueError(f"{_CHECKPOINT.value} is a {predictor.task.type} model: use "
                         f"`python -m bertjax.predict {fits}`")
    if _INPUT.value:
        examples = predictor.examples_from_file(_INPUT.value, _TEXT_COLUMNS.value,
                                                fmt=_FORMAT.value)
    else:
        examples = predictor.examples_from_texts(_TEXT.value, _CONTEXT.value)
    records = predictor.predict(examples)
    if _OUTPUT.value:
        from bertjax.data.features import atomic_write_text
        atomic_write_text(_OUTPUT.value, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                 for r in records))
        print(f"{len(records)} predictions written to {_OUTPUT.value}")
    else:
        for record in records:
            print(_task_line(record))


# Task name -> function.
TASKS = {"fill-mask": fill_mask_main,
         **{c: (lambda c=c: task_main(c)) for c in TASK_COMMANDS}}


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in TASKS:
        raise app.UsageError(f"usage: python -m bertjax.predict TASK [flags]; TASK is one of "
                             f"{', '.join(TASKS)}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
    try:
        TASKS[argv[1]]()
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"bertjax.predict: error: {e}")


if __name__ == "__main__":
    app.run(main)
