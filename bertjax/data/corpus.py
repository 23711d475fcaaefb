"""Reading pretraining corpora as documents of sentences, and our sentence splitter.

Every reader yields one document at a time as a list of sentence strings, so a corpus of any
size streams through in the memory of one document. Formats:

  bert    one sentence per line, a blank line between documents (the original BERT layout)
  text    raw text; a file is a document, paragraphs (blank-line separated, wrapped lines
          joined) are split into sentences by `split_sentences`
  austen  the embedded Jane Austen corpus: a document per chapter, front and back matter,
          volume and chapter headings dropped
  jsonl   one JSON object per line, one document per line, text under `text_key`
  tfds    a TFDS text dataset prepared locally, given as `name[/config][:version]:feature`

In `jsonl` and `tfds` text every newline is a hard break (their text fields hold paragraphs,
not wrapped lines), and the pieces are split into sentences by `split_sentences`.
Paths may be local or remote (gs://): files are read through `bertjax.files`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from typing import Callable, Iterable, Iterator

from bertjax import files

FORMATS = ("auto", "bert", "text", "austen", "jsonl", "tfds")

Document = list[str]

# ---------------------------------------------------------------------------------------------
# Sentence splitting

# Abbreviations that are followed by a name or a word, so a period after them never ends a
# sentence ("Mr. Darcy", "St. James's"). "etc." is not here: it often does. Dotted ones
# ("e.g.", "U.S.") are recognized by their shape.
_TITLE_ABBREVIATIONS = frozenset("""
    mr mrs ms mssrs messrs dr drs st prof sr jr rev revd hon capt col gen lt maj sgt cmdr adm
    gov sen rep pres supt mt ft mme mlle mm esq vs cf viz approx ca al dept univ assn bros
""".split())
# Abbreviations that end a sentence only if no number follows them ("No. 5", "pp. 10-12").
_NUMBER_ABBREVIATIONS = frozenset("no nos vol vols p pp fig figs art ch sec ed eq".split())

_CLOSERS = "\"'”’»›)]}」』）】〉》"
_OPENERS = "\"'“‘«‹([{「『（【〈《"
# A run of terminators plus any closing quotes/brackets after it. CJK terminators end a
# sentence by themselves: Chinese and Japanese put no space after them.
_TERMINATOR = re.compile(
    r"(?P<cjk>[。！？][。！？!?]*)[" + re.escape(_CLOSERS) + r"]*"
    r"|(?P<latin>[.!?…]+)[" + re.escape(_CLOSERS) + r"]*(?=\s|$)")
_DOTTED = re.compile(r"[^\W\d_](\.[^\W\d_])+", re.UNICODE)  # U.S, e.g: abbreviations, not ends
_WHITESPACE = re.compile(r"\s+")


def split_sentences(text: str) -> list[str]:
    """Splits one paragraph into sentences; whitespace runs become single spaces.

    A sentence ends at `.`, `!`, `?` or an ellipsis (plus closing quotes or brackets) that is
    followed by whitespace and then by something that is not a lowercase letter, except after
    a title abbreviation (Mr. Dr. St. e.g. ...), an initial ("J. K. Rowling"), a dotted
    abbreviation ("U.S.") or a numbering abbreviation before a number ("No. 5"). A sentence
    also ends at Chinese/Japanese `。！？` (with any closing quotes), space or not.
    """
    text = _WHITESPACE.sub(" ", text).strip()
    sentences, start = [], 0
    for m in _TERMINATOR.finditer(text):
        end = m.end()
        if m.group("latin") and not _ends_sentence(text, m.start(), m.group("latin"), end):
            continue
        sentence = text[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = end
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def _ends_sentence(text: str, term_start: int, terminator: str, end: int) -> bool:
    # `text` has single spaces only, so short windows around the terminator are enough (and
    # keep long paragraphs linear).
    following = text[end:end + 16].lstrip()
    if not following:
        return True
    first = following.lstrip(_OPENERS)[:1] or following[0]
    if first.islower():
        return False
    if terminator != ".":
        return True
    word = text[text.rfind(" ", 0, term_start) + 1:term_start].lstrip(_OPENERS)
    if not word:
        return True
    lower = word.lower()
    if lower in _TITLE_ABBREVIATIONS or _DOTTED.fullmatch(word):
        return False
    if len(word) == 1 and word.isupper() and word != "I":  # an initial: "J. K. Rowling"
        return False
    if lower in _NUMBER_ABBREVIATIONS and first.isdigit():
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Files


def expand_paths(spec: str | Iterable[str]) -> list[str]:
    """Comma-separated paths or glob patterns -> sorted existing, non-empty files.

    A pattern that matches nothing, or a file that is empty, is an error naming it.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    patterns = [p for p in spec.split(",") if p] if isinstance(spec, str) else list(spec)
    if not patterns:
        raise ValueError("no input given: expected a file, a comma-separated list or a glob")
    paths = []
    for pattern in patterns:
        if files.path(pattern).is_dir():
            raise ValueError(f"input {pattern!r} is a directory: give its files, e.g. "
                             f"--input='{pattern.rstrip('/')}/*.txt'")
        matches = files.glob(pattern)
        if not matches:
            raise FileNotFoundError(f"input {pattern!r}: no such file (or no file matches "
                                    "the pattern)")
        paths.extend(matches)
    for path in paths:
        if files.size(path) == 0:
            raise ValueError(f"input file {path!r} is empty")
    return paths


class _Progress:
    """Bytes read so far over a list of files, for an ETA."""

    def __init__(self, paths: list[str]):
        self.total = sum(files.size(p) for p in paths)
        self.done = 0
        self.file: io.IOBase | None = None  # the file being read

    def fraction(self) -> float | None:
        current = self.file.tell() if self.file is not None and not self.file.closed else 0
        return min(1.0, (self.done + current) / self.total) if self.total else None


def _open_lines(path: str, progress: _Progress | None = None) -> Iterator[str]:
    """Yields the text lines of a (possibly gzip-compressed) UTF-8 file, without newlines."""
    with files.open_binary(path) as raw:
        if progress is not None:
            progress.file = raw
        binary = gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw
        text = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="strict", newline=None)
        number = 0
        try:
            for number, line in enumerate(text, 1):
                yield line.rstrip("\n")
        except UnicodeDecodeError as e:
            raise ValueError(f"input file {path!r} is not UTF-8 text: after line {number}, "
                             f"{e.reason} ({e.object[e.start:e.start + 4]!r})") from None
        except (gzip.BadGzipFile, EOFError) as e:
            raise ValueError(f"input file {path!r} is not a valid gzip file: {e}") from None
    if progress is not None:
        progress.done += files.size(path)
        progress.file = None


def _paragraphs(lines: Iterable[str]) -> Iterator[str]:
    """Blank-line separated paragraphs, wrapped lines joined with a space."""
    current: list[str] = []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            yield " ".join(current)
            current = []
    if current:
        yield " ".join(current)


def split_units(units: Iterable[str]) -> Document:
    """Paragraphs (or hard-broken lines) -> sentences, empty ones dropped."""
    return [s for unit in units for s in split_sentences(unit)]


def keep_sentences(units: Iterable[str]) -> Document:
    """The `bert` format's units are sentences already."""
    return list(units)


# ---------------------------------------------------------------------------------------------
# Readers. With split=False they yield each document's unsplit units (paragraphs or lines) so
# that `prepare` can run the sentence splitter in its worker processes.


def read_bert(paths: list[str], progress: _Progress | None = None,
              split: bool = True) -> Iterator[Document]:
    """One sentence per line, blank lines between documents; a file ends a document too.

    Lines are sentences already, so `split` changes nothing; whitespace runs become spaces.
    """
    for path in paths:
        document: Document = []
        for line in _open_lines(path, progress):
            line = _WHITESPACE.sub(" ", line).strip()
            if line:
                document.append(line)
            elif document:
                yield document
                document = []
        if document:
            yield document


def read_text(paths: list[str], progress: _Progress | None = None,
              split: bool = True) -> Iterator[Document]:
    """Raw text: each file is one document of paragraphs split into sentences."""
    for path in paths:
        paragraphs = list(_paragraphs(_open_lines(path, progress)))
        if not paragraphs:
            raise ValueError(f"input file {path!r} holds no text")
        yield split_units(paragraphs) if split else paragraphs


_NOVEL = re.compile(r"^### (\S+)")
_CHAPTER = re.compile(r"^(CHAPTER|Chapter) +([IVXLC]+|\d+)\.?\s*$")
_VOLUME = re.compile(r"^VOLUME +[IVXLC]+\.?\s*$")
# Back matter after the last chapter: the closing words, and Northanger Abbey's editorial note.
_BACK_MATTER = re.compile(r"^(FINIS|THE END|A NOTE ON THE TEXT)\s*$", re.IGNORECASE)


def read_austen(paths: list[str], progress: _Progress | None = None,
                split: bool = True) -> Iterator[Document]:
    """The embedded Austen text: one document per chapter, headings and front matter dropped.

    Novels start at `### <name>` lines; only text between a `CHAPTER n` heading and the next
    heading, novel or closing line belongs to a chapter.
    """
    def chapter(lines: list[str]) -> Document:
        paragraphs = list(_paragraphs(lines))
        return split_units(paragraphs) if split else paragraphs

    for path in paths:
        chapter_lines: list[str] | None = None
        for line in _open_lines(path, progress):
            is_chapter = _CHAPTER.match(line)
            if is_chapter or _NOVEL.match(line) or _BACK_MATTER.match(line):
                if chapter_lines:
                    yield chapter(chapter_lines)
                chapter_lines = [] if is_chapter else None
            elif chapter_lines is not None and not _VOLUME.match(line):
                chapter_lines.append(line)
        if chapter_lines:
            yield chapter(chapter_lines)


def _hard_lines(text: str, split: bool) -> Document:
    lines = [line for line in text.split("\n") if line.strip()]
    return split_units(lines) if split else lines


def read_jsonl(paths: list[str], text_key: str, progress: _Progress | None = None,
               split: bool = True) -> Iterator[Document]:
    """One JSON object per line; its `text_key` string is one document."""
    for path in paths:
        for number, line in enumerate(_open_lines(path, progress), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or text_key not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path}:{number}: no text field {text_key!r} (found {keys}); "
                                 "set --text_key")
            text = record[text_key]
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number}: field {text_key!r} is "
                                 f"{type(text).__name__}, expected a string")
            document = _hard_lines(text, split)
            if document:
                yield document


def parse_tfds_spec(spec: str) -> tuple[str, str]:
    """'wikipedia/20230601.en:text' -> ('wikipedia/20230601.en', 'text')."""
    name, sep, feature = spec.rpartition(":")
    if not sep or not name or not feature or re.fullmatch(r"[\d.]+", feature):
        raise ValueError(f"TFDS input {spec!r}: expected 'name[/config][:version]:feature', "
                         "e.g. 'wikipedia/20230601.en:text'")
    return name, feature


def read_tfds(spec: str, split_name: str = "train", data_dir: str | None = None,
              counter: Callable[[int], None] | None = None,
              split: bool = True) -> Iterator[Document]:
    """A locally prepared TFDS dataset; each example's `feature` string is one document.

    `counter`, if given, is called with the number of examples in the split (for an ETA) and
    then with 1 for each example read.
    """
    import tensorflow_datasets as tfds  # heavy, and only this format needs it

    name, feature = parse_tfds_spec(spec)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        dataset = tfds.load(name, split=split_name, data_dir=data_dir, download=False)
    except Exception as e:  # tfds raises several types for "not found / not prepared"
        raise FileNotFoundError(
            f"TFDS dataset {name!r} split {split_name!r} is not available locally ({e}). "
            f"Prepare it first (`tfds build {name}`), or point --tfds_data_dir at it") from None
    try:
        total = int(builder.info.splits[split_name].num_examples)
    except (KeyError, TypeError, AttributeError, ValueError):
        total = 0  # unknown size: no ETA
    for example in tfds.as_numpy(dataset):
        if counter is not None:
            counter(total)
        if feature not in example:
            raise ValueError(f"TFDS dataset {name!r}: no feature {feature!r} "
                             f"(found {sorted(example)})")
        text = example[feature]
        document = _hard_lines(text.decode("utf-8") if isinstance(text, bytes) else text, split)
        if document:
            yield document


def detect_format(paths: list[str]) -> str:
    """`jsonl` for .jsonl/.json(.gz) files, `austen` for the embedded corpus, else `text`."""
    names = [os.path.basename(p).removesuffix(".gz") for p in paths]
    if all(n.endswith((".jsonl", ".json")) for n in names):
        return "jsonl"
    if names == [AUSTEN_FILE.removesuffix(".gz")]:
        return "austen"
    return "text"


AUSTEN_FILE = "austen_six_novels.txt.gz"


def austen_path() -> str:
    """The embedded default corpus: Jane Austen's six novels (public domain), gzip-compressed."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "corpus", AUSTEN_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"embedded corpus {path} is missing: the bertjax install is "
                                "incomplete (package data not installed)")
    return path


class Corpus:
    """A corpus source. `documents()` streams it as sentences (afresh on each call);
    `units()` streams it unsplit, for `splitter` to run elsewhere; `fraction()` is the
    part read so far, or None when the size is unknown.
    """

    def __init__(self, spec: str | None = None, fmt: str = "auto", text_key: str = "text",
                 tfds_split: str = "train", tfds_data_dir: str | None = None):
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
        if not spec:
            spec, fmt = austen_path(), ("austen" if fmt == "auto" else fmt)
        spec = os.fspath(spec)
        self.spec, self.text_key = spec, text_key
        self.tfds_split, self.tfds_data_dir = tfds_split, tfds_data_dir
        if fmt == "tfds":
            parse_tfds_spec(spec)
            self.paths: list[str] = []
        else:
            try:
                self.paths = expand_paths(spec)
            except FileNotFoundError as e:
                if ":" in spec and "://" not in spec:
                    raise FileNotFoundError(f"{e.args[0]}; for a TFDS dataset pass "
                                            "--format=tfds") from None
                raise
            if fmt == "auto":
                fmt = detect_format(self.paths)
        self.format = fmt
        self._progress: _Progress | None = None
        self._examples = self._seen = 0

    def describe(self) -> dict:
        """What the manifest records about the source."""
        source = {"input": self.spec, "format": self.format}
        if self.format == "jsonl":
            source["text_key"] = self.text_key
        if self.format == "tfds":
            source["split"] = self.tfds_split
        else:
            source["files"] = [os.path.basename(p) for p in self.paths]
            source["bytes"] = sum(files.size(p) for p in self.paths)
        return source

    def fraction(self) -> float | None:
        if self.format == "tfds":
            return min(1.0, self._seen / self._examples) if self._examples else None
        return self._progress.fraction() if self._progress else None

    def documents(self) -> Iterator[Document]:
        return self._read(split=True)

    def units(self) -> Iterator[Document]:
        return self._read(split=False)

    @property
    def splitter(self) -> Callable[[Document], Document]:
        """`units()` document -> its sentences; a module-level function, so it pickles."""
        return keep_sentences if self.format == "bert" else split_units

    def _read(self, split: bool) -> Iterator[Document]:
        if self.format == "tfds":
            self._seen = 0

            def count(total: int) -> None:
                self._examples = total
                self._seen += 1

            return read_tfds(self.spec, self.tfds_split, self.tfds_data_dir, count, split)
        self._progress = _Progress(self.paths)
        if self.format == "jsonl":
            return read_jsonl(self.paths, self.text_key, self._progress, split)
        reader = {"bert": read_bert, "text": read_text, "austen": read_austen}[self.format]
        return reader(self.paths, self._progress, split)
