"""Token tagging (NER) on CoNLL-style files: one `token tag` per line, blank lines between
sentences, BIO or BIOES tags; the tag of each word is predicted at its first sub-token and
scored at the entity level (seqeval's default mode). Tags that are not an entity scheme are
read as plain classes (configs/finetune/pos.py says so outright).

  python -m bertjax.main --config=configs/finetune/tag.py --workdir=/tmp/ner \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=ner/train.txt --config.task.eval_files=ner/dev.txt \\
      --config.task.eval_files=ner/test.txt

Tags that break the scheme (an I-X not after B-X or I-X) are repaired and counted;
--config.task.strict_tags=true makes them an error. Sentences longer than a row are read in
windows doc_stride tokens apart. Predict afterwards with
`python -m bertjax.predict tag --checkpoint=/tmp/ner --text="Emma walked to Highbury"`, which
prints the sentence with its entities bracketed: `[Emma]PER walked to [Highbury]LOC`.
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("tagging")
    config.task.max_seq_length = 128
    config.task.doc_stride = 64
    return config
