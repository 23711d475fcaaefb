"""A small BERT pretrained by bertjax itself on HKCanCor's raw training text, end to end as a
user does it: `prepare` trains a SentencePiece model on the unsegmented utterances and writes
shards, then `main` pretrains configs/tiny.py (shrunk by the overrides below) on them. The
Chinese sequence-labelling tests and benchmarks (segmentation, part-of-speech) fine-tune from
it.
"""

from __future__ import annotations

import json
import os

from benchmarks import config_files

UTTERANCES_PER_DOCUMENT = 20  # conversations are not marked in the corpus; NSP needs documents


def running_text(words: list[str]) -> str:
    """The utterance as it is written: no space except between two words of spaced scripts."""
    from bertjax.tasks.features import written_unspaced
    out = words[0] if words else ""
    for a, b in zip(words, words[1:]):
        out += ("" if written_unspaced(a[-1]) or written_unspaced(b[0]) else " ") + b
    return out


def pretrain(out: str, utterances: list[list[str]], steps: int, hidden: int = 128,
             vocab_size: int = 3000, max_seq_length: int = 64) -> str:
    """The pretraining workdir under OUT (kept and reused when its model is already there)."""
    from bertjax import main as bertjax_main
    from bertjax.data import corpus as corpus_lib
    from bertjax.data import preparation

    workdir = os.path.join(out, "pretrain")
    if os.path.exists(os.path.join(workdir, "model")):
        return workdir
    os.makedirs(out, exist_ok=True)
    source = os.path.join(out, "train-raw.jsonl")
    with open(source, "w", encoding="utf-8") as f:
        for i in range(0, len(utterances), UTTERANCES_PER_DOCUMENT):
            text = "\n".join(map(running_text, utterances[i:i + UTTERANCES_PER_DOCUMENT]))
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    shards = os.path.join(out, "shards")
    preparation.prepare(corpus_lib.Corpus(source, "jsonl"), shards, vocab_size=vocab_size,
                        num_shards=2, overwrite=True, quiet=True)
    config = config_files.load("configs/tiny.py", {
        "data.shard_dir": shards, "model.hidden_size": hidden, "model.num_hidden_layers": 2,
        "model.num_attention_heads": 4, "model.intermediate_size": 2 * hidden,
        "data.max_seq_length": max_seq_length, "data.max_predictions_per_seq": 10,
        "train.num_steps": steps, "train.log_every": 50, "train.eval_every": steps,
        "train.eval_batches": 2, "train.checkpoint_every": steps, "quiet": True})
    bertjax_main.run_mode(config, workdir)
    return workdir


def write_segmented(path: str, utterances: list[list[str]]) -> str:
    """The bakeoff layout: one utterance a line, its words separated by spaces."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(u) + "\n" for u in utterances)
    return path


def write_tagged(path: str, sentences: list[tuple[list[str], list[str]]]) -> str:
    """CoNLL-style `word tag` lines, a blank line after each sentence."""
    with open(path, "w", encoding="utf-8") as f:
        for words, tags in sentences:
            f.writelines(f"{w} {t}\n" for w, t in zip(words, tags))
            f.write("\n")
    return path
