"""A tiny random BERT with the real WordPiece vocabulary, small task files, and fine-tuning
configs for tests of the loop's mechanics (the real-data tests use converted MiniLM)."""
from __future__ import annotations

import os
import pathlib
import tempfile

import flax.linen as nn
import jax
import numpy as np

from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining, init_params
from bertjax.training import checkpoints, finetune_config
from benchmarks.task_data import austen_paragraphs, wordpiece

TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64)


def tiny_pretraining_params(seed: int = 0):
    return nn.unbox(init_params(BertForPreTraining(TINY), jax.random.PRNGKey(seed)))


def tiny_model_dir(directory: str) -> str:
    checkpoints.save_model(directory, tiny_pretraining_params(), TINY, wordpiece())
    return directory


def tiny_pretraining_workdir(workdir, seed: int = 3) -> str:
    """A pretraining workdir as a run of TINY leaves it mid-run: its architecture (config and
    tokenizer) and one Orbax checkpoint (step 7), no exported model yet."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True)
    checkpoints.write_architecture(str(workdir), TINY, wordpiece())
    ckpt = checkpoints.RunCheckpoints(str(workdir), keep=1)
    ckpt.save(7, params=tiny_pretraining_params(seed), opt_state={"x": np.zeros(2)},
              progress={"step": np.int32(7), "rng": np.zeros(2, np.uint32)}, host={})
    ckpt.close()
    return str(workdir)


def sentences(count: int, start: int = 0) -> list[str]:
    """Short Austen sentences (no tabs or quotes, so any file format holds them)."""
    out = []
    for paragraph in austen_paragraphs()[start:]:
        for sentence in paragraph.split(". "):
            if 20 < len(sentence) < 80 and '"' not in sentence:
                out.append(sentence)
                if len(out) == count:
                    return out
    raise ValueError("not enough sentences")


def write_tsv(path: str, rows: list[tuple], header: tuple) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        f.writelines("\t".join(map(str, r)) + "\n" for r in rows)
    return path


def classification_files(directory: str) -> dict[str, str]:
    """Label 'long' for sentences over 50 characters, else 'short'."""
    texts = sentences(104)
    rows = [(t, "long" if len(t) > 50 else "short") for t in texts]
    return {"train": write_tsv(os.path.join(directory, "train.tsv"), rows[:64],
                               ("sentence", "label")),
            "dev": write_tsv(os.path.join(directory, "dev.tsv"), rows[64:84],
                             ("sentence", "label")),
            "test": write_tsv(os.path.join(directory, "test.tsv"), [(t,) for t, _ in rows[84:]],
                              ("sentence",))}


def tiny_config(init_checkpoint: str, type: str = "classification", **task):
    config = finetune_config.defaults(type)
    config.init_checkpoint = init_checkpoint
    config.quiet = True
    config.task.max_seq_length = 16
    config.optimizer.name = "adamw"
    config.optimizer.schedule = "warmup_linear"
    config.optimizer.learning_rate = 1e-3
    config.train.global_batch_size = 16
    config.train.eval_batch_size = 16
    config.train.num_epochs = 2.0
    config.train.log_every = 2
    for key, value in task.items():
        if isinstance(config.task[key], tuple) and isinstance(value, str):
            value = tuple(v for v in value.split(",") if v)  # files or columns, as a tuple
        config.task[key] = value
    return config


def vocabulary_cut_to(model_dir: str, directory: str, texts) -> str:
    """`model_dir` with its WordPiece vocabulary cut to the special tokens and the pieces of
    `texts` (word embeddings, and any other per-piece parameter, row for row): the same
    tokenization of those texts, and an output layer a few hundred pieces wide instead of
    30,522, which is most of a small seq2seq model's step. WordPiece takes the longest piece
    in the vocabulary; every piece it took for these texts stays, and no longer one appears."""
    from bertjax.data.tokenizers import SPECIAL_TOKENS, load_tokenizer
    config, params = checkpoints.load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    used = {i for ids in tokenizer.encode_batch(list(texts)) for i in ids}
    kept = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] + sorted(
        used - {tokenizer.token_to_id(t) for t in SPECIAL_TOKENS})
    scratch = tempfile.mkdtemp()
    with open(os.path.join(scratch, "vocab.txt"), "w", encoding="utf-8") as f:
        f.writelines(tokenizer.id_to_token(i) + "\n" for i in kept)
    rows = np.asarray(kept)
    params = jax.tree.map(lambda x: np.asarray(x)[rows] if np.ndim(x) and
                          np.shape(x)[0] == config.vocab_size else np.asarray(x), params)
    cut = BertConfig.from_dict(config.to_dict(), vocab_size=len(kept))
    checkpoints.save_model(directory, params, cut, load_tokenizer(scratch))
    return directory
