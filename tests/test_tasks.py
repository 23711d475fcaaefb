"""Sentence and pair task inputs: TSV/CSV/JSONL reading (quoting, headers, clear errors),
label vocabularies, features identical to transformers' BERT encoding, TFDS by name."""
import os

import numpy as np
import pytest
from transformers import BertTokenizerFast

from bertjax.tasks.features import LabelVocab
from bertjax.tasks.classify import classification_features, read_table, read_tfds
from bertjax.tasks.squad import Squad
from benchmarks.task_data import MINILM_DIR, wordpiece


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece()


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_glue_tsv_keeps_quotes_literally_and_names_lines(tmp_path):
    path = _write(tmp_path / "train.tsv",
                  "sentence\tlabel\n"
                  "the Rock is the new ''Conan''\t1\n"
                  '"a "quoted" word\t0\n'
                  "\n"
                  "plain text\t1\n")
    examples = read_table(path, ["sentence"], "label")
    assert [e.text_a for e in examples] == ["the Rock is the new ''Conan''", '"a "quoted" word',
                                            "plain text"]
    assert [e.label for e in examples] == ["1", "0", "1"]
    assert examples[2].guid == "train.tsv:5"


def test_headerless_tsv_by_position_and_regression(tmp_path):
    path = _write(tmp_path / "scores.txt", "1\t2.25\tgood film\r\n2\t-0.6\ttoo tepid\r\n")
    examples = read_table(path, [2], 1, header=False, regression=True)
    assert [(e.text_a, e.label) for e in examples] == [("good film", 2.25), ("too tepid", -0.6)]
    with pytest.raises(ValueError, match=r"scores.txt: no column 'text'; it has no header, so "
                                         r"name columns by position 0..2"):
        read_table(path, ["text"], 1, header=False)
    bad = _write(tmp_path / "bad.tsv", "1\tnot-a-number\tx\n")
    with pytest.raises(ValueError, match=r"bad.tsv:1: label column 1 is 'not-a-number', expected "
                                         r"a number"):
        read_table(bad, [2], 1, header=False, regression=True)


def test_csv_quoting_and_pairs(tmp_path):
    path = _write(tmp_path / "pairs.csv",
                  'a,b,y\n"one, with comma","two ""quoted""",yes\n"multi\nline",b,no\n')
    examples = read_table(path, ["a", "b"], "y")
    assert (examples[0].text_a, examples[0].text_b) == ("one, with comma", 'two "quoted"')
    assert examples[1].text_a == "multi\nline" and examples[1].label == "no"


def test_jsonl_and_missing_columns_are_clear_errors(tmp_path):
    path = _write(tmp_path / "d.jsonl", '{"text": "hi", "label": 1}\n\n{"text": "yo", "label": 0}\n')
    assert [(e.text_a, e.label) for e in read_table(path, ["text"], "label")] == [
        ("hi", "1"), ("yo", "0")]
    with pytest.raises(ValueError, match=r"d.jsonl:1: no column 'sentence'; it has columns "
                                         r"\['label', 'text'\]"):
        read_table(path, ["sentence"], "label")
    tsv = _write(tmp_path / "t.tsv", "sentence\tlabel\nx\t1\n")
    with pytest.raises(ValueError, match=r"t.tsv: no column 'text'; it has columns "
                                         r"\['sentence', 'label'\]"):
        read_table(tsv, ["text"], "label")
    ragged = _write(tmp_path / "r.tsv", "sentence\tlabel\nx\t1\ny\n")
    with pytest.raises(ValueError, match=r"r.tsv:3: 1 fields, expected 2 \(as the header\)"):
        read_table(ragged, ["sentence"], "label")
    with pytest.raises(ValueError, match="cannot tell the format"):
        read_table(_write(tmp_path / "x.parquet", ""), ["a"])


def test_label_vocab_order_save_and_unseen_label(tmp_path):
    vocab = LabelVocab.from_labels(["10", "2", "1", "2"])
    assert vocab.labels == ["1", "2", "10"]
    assert LabelVocab.from_labels(["B-PER", "O", "I-PER"], first="O").labels == [
        "O", "B-PER", "I-PER"]
    vocab.save(str(tmp_path))
    assert LabelVocab.load(str(tmp_path)) == vocab
    assert os.listdir(tmp_path) == ["labels.json"]
    with pytest.raises(ValueError, match=r"dev.tsv:7: label '3' does not occur in the training"):
        vocab.id("3", "dev.tsv:7")


def test_features_match_transformers_bert_encoding(tmp_path, tokenizer):
    hf = BertTokenizerFast.from_pretrained(MINILM_DIR)
    path = _write(tmp_path / "p.tsv", "a\tb\tlabel\n"
                                      "The quick brown fox.\tIt jumped over the lazy dog!\tyes\n"
                                      "Café déjà vu\tnaïve résumé\tno\n")
    examples = read_table(path, ["a", "b"], "label")
    vocab = LabelVocab.from_labels(e.label for e in examples)
    features = classification_features(examples, tokenizer, 24, vocab)
    ref = hf([e.text_a for e in examples], [e.text_b for e in examples], padding="max_length",
             max_length=24)
    np.testing.assert_array_equal(features.arrays["input_ids"], ref["input_ids"])
    np.testing.assert_array_equal(features.arrays["segment_ids"], ref["token_type_ids"])
    np.testing.assert_array_equal(features.arrays["input_mask"], ref["attention_mask"])
    np.testing.assert_array_equal(features.arrays["label"], [1, 0])
    assert features.arrays["input_ids"].dtype == np.int32


def test_truncation_takes_from_the_longer_text(tokenizer):
    from bertjax.tasks.classify import TextExample
    long_a = " ".join(["alpha"] * 20)
    features = classification_features(
        [TextExample("x", long_a, "beta gamma"), TextExample("y", long_a)], tokenizer, 10)
    alpha, beta, gamma = (tokenizer.token_to_id(w) for w in ("alpha", "beta", "gamma"))
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    np.testing.assert_array_equal(features.arrays["input_ids"][0],
                                  [cls] + [alpha] * 5 + [sep, beta, gamma, sep])
    np.testing.assert_array_equal(features.arrays["input_ids"][1], [cls] + [alpha] * 8 + [sep])
    assert features.stats["truncated"] == 2 and "label" not in features.arrays


def test_regression_labels_are_float(tokenizer):
    from bertjax.tasks.classify import TextExample
    features = classification_features([TextExample("x", "a", "b", 3.8)], tokenizer, 8,
                                       regression=True)
    assert features.arrays["label"].dtype == np.float32
    assert features.arrays["label"][0] == pytest.approx(3.8)


def test_tfds_by_name_with_mocked_data_and_clear_error_when_missing(tmp_path):
    import tensorflow_datasets as tfds
    with tfds.testing.mock_data(num_examples=4):
        sst2 = read_tfds("glue/sst2", "train")
        stsb = read_tfds("glue/stsb", "validation")
        squad = Squad(None).read_tfds("squad/v2.0", "train", None)
    assert len(sst2) == 4 and {e.label for e in sst2} <= {"negative", "positive"}
    assert all(isinstance(e.label, float) and e.text_b is not None for e in stsb)
    assert len(squad) == 4 and all(e.context for e in squad)
    with pytest.raises(FileNotFoundError, match=r"glue/mrpc is not prepared under .*tfds build"):
        read_tfds("glue/mrpc", "train", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="TFDS dataset 'imdb'"):
        read_tfds("imdb", "train")


def test_each_task_owns_its_settings_and_a_task_json_reads_through_them(tmp_path):
    from bertjax.tasks import base as tasks
    from bertjax.training import finetune_config
    # The tagging section is tagging's: no table columns, its own scheme keys.
    tagging = tasks.get("tagging").settings()
    assert "scheme" in tagging and "text_columns" not in tagging
    assert "text_columns" in tasks.get("seq2seq").settings()
    config = finetune_config.defaults("classification")
    config.init_checkpoint, config.task.train_file = "model", "train.tsv"
    config.task.type = "regression"  # one family, one section
    assert finetune_config.validate(config).name == "regression"
    config.task.type = "tagging"
    with pytest.raises(ValueError, match=r"task.type tagging: the config's task section was "
                                         r"made for another task .*finetune_config.defaults\('tagging'\)"):
        finetune_config.validate(config)
    # A task.json written when unset settings were "" reads as unset.
    LabelVocab.from_labels(["O", "B-PER"]).save(str(tmp_path))
    (tmp_path / "task.json").write_text('{"type": "tagging", "max_seq_length": 64, '
                                        '"doc_stride": 32, "tag_scheme": "", "scheme": ""}')
    task, _ = tasks.Task.from_model_directory(str(tmp_path))
    assert (task.settings.scheme, task.settings.doc_stride, task.kind) == (None, 32, "entity")
    (tmp_path / "task.json").write_text('{"type": "tagging", "num_beams": 4}')
    with pytest.raises(ValueError, match="task.json: 'num_beams' is not a setting of task.type "
                                         "tagging"):
        tasks.Task.from_model_directory(str(tmp_path))
