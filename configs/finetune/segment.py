"""Chinese word segmentation as character tagging (BMES): one sentence a line with its words
separated by spaces (the SIGHAN bakeoff layout), or CoNLL `character tag` lines; scored by
word-level precision, recall and F1, and the recall of words the training set lacks.

  python -m bertjax.main --config=configs/finetune/segment.py --workdir=/tmp/cws \\
      --config.init_checkpoint=/tmp/zh-pretrain \\
      --config.task.train_file=cws/train.txt --config.task.eval_files=cws/test.txt

CKPT (`init_checkpoint`) is a model with Chinese in its vocabulary: a bertjax pretraining
workdir (`python -m bertjax.prepare --input=zh.txt --output=/tmp/zh` trains a SentencePiece
model on the text; then `python -m bertjax.main --config=configs/tiny.py
--workdir=/tmp/zh-pretrain --config.data.shard_dir=/tmp/zh`) or a converted Chinese BERT
(WordPiece, a character a token). Sentences longer than a row are read in windows
doc_stride characters apart. Segment text afterwards with
`python -m bertjax.predict segment --checkpoint=/tmp/cws --text="我喜欢北京的秋天"`
(prints the words, separated by spaces; `--input=raw.txt --output=words.jsonl` for a file of
one sentence a line).
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("segmentation")
    config.task.max_seq_length = 128
    config.task.doc_stride = 64
    return config
