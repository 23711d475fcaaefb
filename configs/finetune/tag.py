"""Token tagging (NER) on CoNLL-style files: one `token tag` per line, blank lines between
sentences, BIO or BIOES tags; the tag of each word is predicted at its first sub-token and
scored at the entity level (seqeval's default mode).

  python -m bertjax.main --config=configs/finetune/tag.py --workdir=/tmp/ner \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=ner/train.txt --config.task.eval_files=ner/dev.txt \\
      --config.task.eval_files=ner/test.txt

Tags that break the scheme (an I-X not after B-X or I-X) are repaired and counted;
--config.task.strict_tags=true makes them an error. Predict afterwards with
`python -m bertjax.predict tag --checkpoint=/tmp/ner --text="Emma walked to Highbury"`.
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults()
    config.task.type = "tagging"
    config.task.max_seq_length = 128
    return config
