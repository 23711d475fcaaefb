"""Corpus readers and the sentence splitter: what becomes a document, what a sentence."""
import gzip
import json
import os
import re

import pytest

from bertjax.data import corpus


@pytest.mark.parametrize("text, sentences", [
    ("Mr. Darcy met Mrs. Bennet at St. James's. Dr. Jones was there too.",
     ["Mr. Darcy met Mrs. Bennet at St. James's.", "Dr. Jones was there too."]),
    ("J. K. Rowling wrote it. She did, with Prof. McGonagall in mind.",
     ["J. K. Rowling wrote it.", "She did, with Prof. McGonagall in mind."]),
    ("Fruit, e.g. Apples, i.e. Red ones, etc. and more. Then stop.",
     ["Fruit, e.g. Apples, i.e. Red ones, etc. and more.", "Then stop."]),
    ("They bought pens, ink, etc. The shop closed.",
     ["They bought pens, ink, etc.", "The shop closed."]),
    ('"Is he married?" said she. "No!" cried he. "Oh! my dear."',
     ['"Is he married?" said she.', '"No!" cried he.', '"Oh! my dear."']),
    ("He left. \"Where?\" she asked. (It was late.) Then he came back [at noon.] Fine.",
     ["He left.", "\"Where?\" she asked.", "(It was late.)", "Then he came back [at noon.]",
      "Fine."]),
    ("He said “Stop.” Then he left. ‘Why?’ Nobody knew.",
     ["He said “Stop.”", "Then he left.", "‘Why?’", "Nobody knew."]),
    ("Wait... Then it happened. And then... nothing. Really…  Yes!",
     ["Wait...", "Then it happened.", "And then... nothing.", "Really…", "Yes!"]),
    ("It costs 3.50 dollars. See No. 5 and pp. 10-12 for details. No. Never.",
     ["It costs 3.50 dollars.", "See No. 5 and pp. 10-12 for details.", "No.", "Never."]),
    ("The U.S. Army arrived at 5 p.m. on Friday. It left.",
     ["The U.S. Army arrived at 5 p.m. on Friday.", "It left."]),
    ("Wrapped\nlines   and  extra   spaces. Are joined.",
     ["Wrapped lines and extra spaces.", "Are joined."]),
    ("我喜欢自然语言处理。你呢？我很好！", ["我喜欢自然语言处理。", "你呢？", "我很好！"]),
    ("他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
    ("今日は晴れです。明日は「雨でしょう。」そうですか？", ["今日は晴れです。", "明日は「雨でしょう。」", "そうですか？"]),
    ("Hello there. 你好。 Bye.", ["Hello there.", "你好。", "Bye."]),
    ("no terminator at the end", ["no terminator at the end"]),
    ("   ", []),
])
def test_split_sentences(text, sentences):
    assert corpus.split_sentences(text) == sentences


def test_austen_chapters_are_documents():
    documents = list(corpus.Corpus().documents())
    # Emma 55 + Mansfield Park 48 + Northanger Abbey 31 + Persuasion 24
    # + Pride and Prejudice 61 + Sense and Sensibility 50 chapters.
    assert len(documents) == 269
    assert documents[0][0].startswith("Emma Woodhouse, handsome, clever, and rich,")
    assert documents[-1][-1].endswith("or producing coolness between their husbands.")
    sentences = [s for d in documents for s in d]
    assert 30_000 < len(sentences) < 33_000
    headings = re.compile(r"^(CHAPTER \w+|Chapter \d+|VOLUME \w+|FINIS|Finis|THE END|"
                          r"By Jane Austen|EMMA|PRIDE AND PREJUDICE)$|^###")
    assert not [s for s in sentences if headings.match(s)]
    assert not [s for s in sentences if "ADVERTISEMENT BY THE AUTHORESS" in s
                or "A NOTE ON THE TEXT" in s or "Signet Classic" in s]
    assert all(d for d in documents)


def test_pride_and_prejudice_has_61_chapters(tmp_path):
    with gzip.open(corpus.austen_path(), "rt", encoding="utf-8") as f:
        text = f.read()
    start = text.index("### prideprejudice")
    novel = text[start:text.index("### sensesensibility")]
    path = tmp_path / "pp.txt"
    path.write_text(novel, encoding="utf-8")
    chapters = list(corpus.read_austen([str(path)]))
    assert len(chapters) == 61
    assert chapters[0][0] == ("It is a truth universally acknowledged, that a single man in "
                              "possession of a good fortune, must be in want of a wife.")
    assert chapters[0][2].startswith('"My dear Mr. Bennet," said his lady to him one day,')


def test_text_files_are_documents_of_paragraphs(tmp_path):
    (tmp_path / "a.txt").write_text("First line\nwrapped here. Second sentence.\n\n"
                                    "New paragraph\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\ufeffCompressed text. Also fine.\n")
    c = corpus.Corpus(str(tmp_path / "*.txt*"))
    assert c.format == "text"
    assert list(c.documents()) == [
        ["First line wrapped here.", "Second sentence.", "New paragraph"],
        ["Compressed text.", "Also fine."]]
    assert c.fraction() == 1.0
    assert c.describe()["files"] == ["a.txt", "b.txt.gz"]
    # The parallel path gives the same sentences.
    assert [c.splitter(u) for u in c.units()] == list(c.documents())


def test_bert_format(tmp_path):
    path = tmp_path / "bert.txt"
    path.write_text("Doc one, sentence one.\nSentence two.  No split here. \n\n\n"
                    "Doc two.\n\nDoc three.\n", encoding="utf-8")
    assert list(corpus.Corpus(str(path), "bert").documents()) == [
        ["Doc one, sentence one.", "Sentence two. No split here."], ["Doc two."],
        ["Doc three."]]


def test_jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"body": "Title\nFirst sentence. Second one.", "id": 1}, {"body": ""},
            {"body": "另一个文档。第二句。"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + "\n",
                    encoding="utf-8")
    c = corpus.Corpus(str(path), text_key="body")
    assert c.format == "jsonl"
    assert list(c.documents()) == [["Title", "First sentence.", "Second one."],
                                   ["另一个文档。", "第二句。"]]
    with pytest.raises(ValueError, match=r"docs.jsonl:1: no text field 'text' \(found \['body', "
                                       r"'id'\]\)"):
        list(corpus.Corpus(str(path)).documents())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok."}\n{"text": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: field 'text' is int"):
        list(corpus.Corpus(str(bad)).documents())
    bad.write_text('{"text": "ok."}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        list(corpus.Corpus(str(bad)).documents())


def test_input_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        corpus.Corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match=r"\*.md"):
        corpus.Corpus(str(tmp_path / "*.md"))
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt' is empty"):
        corpus.Corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "blank.txt").write_text("\n   \n\n")
    with pytest.raises(ValueError, match="blank.txt' holds no text"):
        list(corpus.Corpus(str(tmp_path / "blank.txt")).documents())
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt' is not UTF-8"):
        list(corpus.Corpus(str(tmp_path / "latin1.txt")).documents())
    with pytest.raises(ValueError, match="format 'xml'"):
        corpus.Corpus(str(tmp_path / "blank.txt"), "xml")


def test_tfds_reads_a_dataset(monkeypatch):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    texts = ["First article. It has two sentences.\n\nA second paragraph.", "",
             "Second article."]
    calls = {}

    class Info:
        splits = {"train": type("Split", (), {"num_examples": len(texts)})()}

    def fake_load(name, split, data_dir, download):
        calls.update(name=name, split=split, download=download)
        return tf.data.Dataset.from_tensor_slices({"text": texts, "title": ["a", "b", "c"]})

    monkeypatch.setattr(tfds, "load", fake_load)
    monkeypatch.setattr(tfds, "builder", lambda name, data_dir: type("B", (), {"info": Info})())
    c = corpus.Corpus("wikipedia/20230601.en:text", "tfds")
    assert list(c.documents()) == [
        ["First article.", "It has two sentences.", "A second paragraph."], ["Second article."]]
    assert calls == {"name": "wikipedia/20230601.en", "split": "train", "download": False}
    assert c.fraction() == 1.0
    with pytest.raises(ValueError, match="no feature 'body'"):
        list(corpus.Corpus("wikipedia/20230601.en:body", "tfds").documents())


def test_tfds_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass --format=tfds"):
        corpus.Corpus("wikipedia/20230601.en:text")
    with pytest.raises(ValueError, match="expected 'name"):
        corpus.Corpus("wikipedia", "tfds")
    with pytest.raises(ValueError, match="expected 'name"):
        corpus.Corpus("mnist:3.0.1", "tfds")
    c = corpus.Corpus("mnist:image", "tfds", tfds_data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="TFDS dataset 'mnist' split 'train' is not "
                                                "available locally"):
        next(c.documents())


def test_austen_path_is_packaged():
    path = corpus.austen_path()
    assert os.path.basename(path) == "austen_six_novels.txt.gz"
    assert os.path.isfile(os.path.join(os.path.dirname(path), "README.md"))
