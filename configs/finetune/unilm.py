"""Text-to-text generation with one BERT stack (UniLM, Dong et al. 2019): the checkpoint's
BERT and masked-LM head read `[CLS] source [SEP] target [SEP]` under the seq2seq attention
mask (source tokens see the source; target tokens the source and the target before them).
Each training step masks 70% of the target tokens and predicts them; generation appends a
[MASK] and predicts it, token by token, here with beam search (4 beams); scored with BLEU,
chrF and ROUGE-L. BERT2BERT (configs/finetune/seq2seq.py) is the two-stack alternative.

  python -m bertjax.main --config=configs/finetune/unilm.py --workdir=/tmp/paraphrase-unilm \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=train.tsv --config.task.eval_files=dev.tsv

CKPT (`init_checkpoint`) is a model directory (`python -m bertjax.convert --from=hf
--input=<Hugging Face BERT dir> --output=/tmp/minilm`) or a bertjax pretraining workdir; a
pretraining model's masked-LM head is where the predictions start from. Files are TSVs with a
header `source<TAB>target` (CSV and JSONL alike). Source and target share one row of
task.max_seq_length + task.max_target_length positions, which the model's
max_position_embeddings must hold. Predictions go to WORKDIR/predictions/<set>.jsonl.
Generate afterwards with
`python -m bertjax.predict generate --checkpoint=/tmp/paraphrase-unilm --text="..."`.
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("unilm")
    config.task.text_columns = ("source",)
    config.task.label_column = "target"
    config.task.max_seq_length = 128
    config.task.max_target_length = 64
    config.task.target_mask_rate = 0.7
    config.task.num_beams = 4
    config.task.label_smoothing = 0.1
    config.optimizer.learning_rate = 5e-5
    config.train.num_epochs = 3.0
    return config
