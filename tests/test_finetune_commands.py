"""Every fine-tuning config runs as its docstring says, from a converted checkpoint or from a
pretraining workdir (the configs take turns; classification runs from both): each `python -m bertjax.main` command of the docstring is parsed by the
real flag parser, its files are made in the layout it names (columns, formats, eval sets),
it runs shrunk to a few steps, and the model it leaves answers `bertjax.predict`."""
import csv
import json
import os

import numpy as np
import pytest

from benchmarks import real_data
from bertjax import main
from bertjax.training.inference import TaskPredictor
from config_commands import ROOT, docstring_commands, parse
from finetune_helpers import sentences, tiny_model_dir, tiny_pretraining_workdir, write_tsv

CONFIGS = ("classify", "pair", "tag", "pos", "segment", "squad", "seq2seq", "unilm", "choice")
SOURCES = ("converted", "pretraining workdir")
# Both sources feed every task through the same reader (checkpoints.open_model), so each
# config runs from one of them, in turn; classification from both.
CASES = [("classify", SOURCES[1])] + [(name, SOURCES[i % 2]) for i, name in enumerate(CONFIGS)]
# Chinese words for segmentation files (the tests' WordPiece vocabulary holds these characters).
CHINESE_WORDS = ("北京", "上海", "中国", "的", "天", "很", "好", "我们", "喜欢", "去", "大", "城")
# Appended to each docstring command: a tiny budget (later flags win), each task key where
# the config's task section has it.
SHRINK = ["--config.task.max_seq_length=32", "--config.task.doc_stride=16",
          "--config.task.max_query_length=12", "--config.train.global_batch_size=16",
          "--config.train.eval_batch_size=16", "--config.train.num_epochs=1",
          "--config.task.max_target_length=8", "--config.task.num_beams=2",
          "--config.quiet=true"]


def shrink(task) -> list[str]:
    return [a for a in SHRINK if not a.startswith("--config.task.")
            or a[len("--config.task."):].split("=")[0] in task]


def write_task_file(path: str, config, start: int) -> str:
    """A small labelled file in the layout `config.task` expects."""
    task = config.task
    texts = sentences(48, start=start)
    if task.type == "segmentation":
        rng = np.random.default_rng(start)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(" ".join(rng.choice(CHINESE_WORDS, size=int(rng.integers(3, 12))))
                         + "\n" for _ in texts)
        return path
    if task.type == "tagging":
        lines = ["-DOCSTART- O", ""]
        for text in texts:
            if task.scheme == "plain":  # part-of-speech-like classes
                lines += [f"{w} {'NNP' if w[:1].isupper() else 'W' + str(len(w) % 3)}"
                          for w in text.split()] + [""]
                continue
            lines += [f"{w} {'B-NAME' if w[:1].isupper() else 'O'}" for w in text.split()] + [""]
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        return path
    if task.type == "squad":
        return real_data.write_squad(path, real_data.austen_questions()[start:start + 48])
    if task.type == "multiple_choice":  # SWAG's columns; the right ending is the next sentence
        rng = np.random.default_rng(start)
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow([task.context_column, task.question_column, *task.choice_columns,
                             task.label_column])
            for i, text in enumerate(texts):
                label = int(rng.integers(len(task.choice_columns)))
                endings = [texts[int(j)] for j in rng.integers(len(texts),
                                                               size=len(task.choice_columns))]
                endings[label] = texts[(i + 1) % len(texts)]
                writer.writerow([text, "Then", *endings, label])
        return path
    columns = list(task.text_columns)
    labels = ([len(t) / 20 for t in texts] if task.type == "regression"
              else ["long" if len(t) > 50 else "short" for t in texts])
    rows = [(*[texts[(i + k) % len(texts)] for k in range(len(columns))], label)
            for i, label in enumerate(labels)]
    return write_tsv(path, rows, (*columns, task.label_column))


def predict_one(predictor: TaskPredictor) -> dict:
    if predictor.task.name == "segmentation":
        (record,) = predictor.predict(predictor.task.examples_from_texts(["北京的天气 很好"]))
        printed = predictor.task.format_record(record)  # the words, separated by spaces
        assert printed.replace(" ", "") == "北京的天气很好" and printed == " ".join(
            record["predictions"]), printed
        return record
    if predictor.task.name == "squad":
        examples = predictor.task.examples_from_texts(
            ["Which person is named in this passage?"], "Emma walked to Highbury with Harriet.")
    elif predictor.task.name == "multiple_choice":
        examples = predictor.task.examples_from_texts(
            ["Emma walked to Highbury\tShe was happy.\tThe road sang."])
    else:
        examples = predictor.task.examples_from_texts(["Emma walked to Highbury\tShe was happy."])
    (record,) = predictor.predict(examples)
    if predictor.task.name == "tagging" and predictor.task.kind == "plain":
        assert predictor.task.format_record(record).startswith("Emma/")  # word/TAG pairs
    return record


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {"converted": tiny_model_dir(str(root / "converted")),
            "pretraining workdir": tiny_pretraining_workdir(root / "pretrain")}


@pytest.mark.parametrize("name,source", CASES)
def test_docstring_command_runs_and_predicts(name, source, checkpoints, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name configs/ relative to the checkout
    commands = [c[3:] for c in docstring_commands(f"configs/finetune/{name}.py")
                if c[2] == "bertjax.main"
                and not any(a.startswith("--config.task.tfds_name=") for a in c)]
    assert commands, f"configs/finetune/{name}.py: no command that runs on files"
    for n, args in enumerate(commands):
        config, _ = parse(args)
        train_name = os.path.basename(config.task.train_file)
        eval_names = [os.path.basename(p) for p in config.task.eval_files]
        assert train_name and eval_names, f"{name}.py command {n}: no train or eval files"
        train = write_task_file(str(tmp_path / f"{n}-0-{train_name}"), config, 200 * n)
        evals = [write_task_file(str(tmp_path / f"{n}-{i}-{base}"), config, 60 * i + 200 * n)
                 for i, base in enumerate(eval_names, 1)]
        kept = [a for a in args
                if not a.startswith(("--config.task.train_file=", "--config.task.eval_files="))]
        workdir = tmp_path / f"run{n}"
        config, _ = parse([
            *kept, f"--workdir={workdir}", f"--config.init_checkpoint={checkpoints[source]}",
            f"--config.task.train_file={train}",
            *(f"--config.task.eval_files={path}" for path in evals), *shrink(config.task)])
        main.run_mode(config, str(workdir))

        results = json.loads((workdir / "eval_results.json").read_text())
        assert len(results["sets"]) == len(evals)
        for metrics in (s["final"]["metrics"] for s in results["sets"].values()):
            assert metrics and all(np.isfinite(v) for v in metrics.values()
                                   if isinstance(v, float)), metrics
        record = predict_one(TaskPredictor(str(workdir)))
        assert "prediction" in record or "predictions" in record, record
