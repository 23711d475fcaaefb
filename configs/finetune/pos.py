"""Part-of-speech tagging (or any tag set whose tags are classes: chunks as plain tags,
morphology, supersenses) on CoNLL-style files: one `token tag` per line, blank lines between
sentences. The tag of each word is predicted at its first sub-token and scored by token
accuracy, with per-tag precision / recall / F1 in eval_results.json.

  python -m bertjax.main --config=configs/finetune/pos.py --workdir=/tmp/pos \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=pos/train.conll --config.task.eval_files=pos/dev.conll

Sentences longer than a row are read in windows doc_stride tokens apart, each word scored in
the window where it has the most context. Tag afterwards with
`python -m bertjax.predict tag --checkpoint=/tmp/pos --text="Emma walked to Highbury"`, which
prints word/TAG pairs (or `--input=words.conll --output=tags.jsonl`).
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("tagging")
    config.task.scheme = "plain"
    config.task.best_metric = "token_accuracy"
    config.task.max_seq_length = 128
    config.task.doc_stride = 64
    return config
