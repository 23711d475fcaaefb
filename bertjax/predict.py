"""`python -m bertjax.predict COMMAND`: predictions from a trained model.

  python -m bertjax.predict fill-mask --checkpoint=/tmp/bertjax-demo/run/model \\
      --text="It is a truth universally [MASK] that a single man in possession of a good \\
fortune must be in want of a wife."

fill-mask prints the `--top_k` most likely tokens, with probabilities, for every [MASK] of
every `--text`. `--checkpoint` is a model directory (what pretraining exports as
WORKDIR/model, or what `python -m bertjax.convert` writes) or a pretraining workdir (its
latest checkpoint, also mid-run).

Fine-tuned models (`--checkpoint` is the fine-tuning WORKDIR or its WORKDIR/model):

  python -m bertjax.predict classify --checkpoint=/tmp/sst2 --text="A gorgeous, witty film."
  python -m bertjax.predict tag --checkpoint=/tmp/ner --text="Emma walked to Highbury"
  python -m bertjax.predict segment --checkpoint=/tmp/cws --text="我喜欢北京的秋天"
  python -m bertjax.predict qa --checkpoint=/tmp/squad --text="Who walked?" \\
      --context="Emma walked to Highbury."
  python -m bertjax.predict classify --checkpoint=/tmp/sst2 --input=test.tsv --output=p.jsonl
  python -m bertjax.predict generate --checkpoint=/tmp/paraphrase --text="Emma smiled."

`classify` gives the label and its probability (or the score of a regression model; a TAB in
`--text` separates a sentence pair), `tag` a tag per word, `qa` the answer span (empty: no
answer), `segment` the words of the text, separated by spaces, `generate` the text a seq2seq
or unilm model writes for each source (decoded as the model was evaluated). `tag` prints
word/TAG pairs for part-of-speech and other plain tag sets, the sentence with its entities
bracketed for entity tags, the words for segmentation tags. `--input` reads a file laid out like the
training data (TSV/CSV/JSONL with `--text_columns`, CoNLL, SQuAD JSON, or for `segment` one
raw sentence a line); `--output` writes one JSON record per example.
"""

from __future__ import annotations

from absl import app, flags, logging

from bertjax import cli

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Model directory or pretraining workdir.")
_TEXT = flags.DEFINE_multi_string(
    "text", [], "Input text, repeatable: with [MASK]s (fill-mask), a sentence or TAB-separated "
    "pair (classify), words (tag), Chinese text (segment), a question (qa), a source "
    "(generate).")
_TOP_K = flags.DEFINE_integer("top_k", 5, "Predictions shown per [MASK].")
_CONTEXT = flags.DEFINE_string("context", "", "qa: the passage that answers the questions.")
_INPUT = flags.DEFINE_string("input", "", "A file to predict on, laid out like training data.")
_OUTPUT = flags.DEFINE_string("output", "", "Write one JSON record per example here.")
_TEXT_COLUMNS = flags.DEFINE_string("text_columns", "sentence",
                                    "--input TSV/CSV/JSONL: comma-separated text columns.")
_FORMAT = flags.DEFINE_string("format", "", "--input format (tsv, csv, jsonl, conll, squad); "
                              "'' tells it from the model's task and the extension.")


def fill_mask_main() -> None:
    from bertjax.training.inference import fill_mask

    if not _CHECKPOINT.value or not _TEXT.value:
        raise app.UsageError("fill-mask needs --checkpoint and at least one --text")
    for text, masks in zip(_TEXT.value, fill_mask(_CHECKPOINT.value, _TEXT.value,
                                                   _TOP_K.value)):
        print(text)
        for i, candidates in enumerate(masks, 1):
            shown = ", ".join(f"{token} {p:.3f}" for token, p in candidates)
            print(f"  [MASK] {i}: {shown}" if len(masks) > 1 else f"  [MASK]: {shown}")


def task_main(command: str) -> None:
    from bertjax import files
    from bertjax.training.inference import TaskPredictor

    if not _CHECKPOINT.value or not (_TEXT.value or _INPUT.value):
        raise app.UsageError(f"{command} needs --checkpoint and --text or --input")
    predictor = TaskPredictor(_CHECKPOINT.value, command=command)
    if _INPUT.value:
        examples = predictor.examples_from_file(
            _INPUT.value, [c for c in _TEXT_COLUMNS.value.split(",") if c], _FORMAT.value)
    else:
        examples = predictor.task.examples_from_texts(_TEXT.value, _CONTEXT.value)
    records = predictor.predict(examples)
    if _OUTPUT.value:
        files.write_jsonl(_OUTPUT.value, records)
        print(f"{len(records)} predictions written to {_OUTPUT.value}")
    else:
        for record in records:
            print(predictor.task.format_record(record))


def commands() -> dict:
    """Command name -> function: fill-mask, and one per task family (classify, tag, qa...)."""
    from bertjax.tasks import base as tasks
    commands = sorted({tasks.get(name).command for name in tasks.names()})
    return {"fill-mask": fill_mask_main, **{c: (lambda c=c: task_main(c)) for c in commands}}


def main(argv: list[str]) -> None:
    available = commands()
    if len(argv) != 2 or argv[1] not in available:
        raise app.UsageError(f"usage: python -m bertjax.predict COMMAND [flags]; COMMAND is "
                             f"one of {', '.join(available)}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
    with cli.one_line_errors("bertjax.predict"):
        available[argv[1]]()


if __name__ == "__main__":
    app.run(main)
