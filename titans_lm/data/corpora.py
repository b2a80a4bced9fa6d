"""The embedded text corpora, split into documents.

Every corpus lives under ``<data_dir>/<directory>/`` as xz-compressed UTF-8 files (a plain,
already-decompressed copy with the same name minus ``.xz`` is accepted too). A document is the
unit that the token store keeps whole and that evaluation scores on its own.

Corpora and splits (provenance and licenses: ``data/README.md`` and each ``SOURCES.md``):

* ``books``: 11 complete Project Gutenberg books, one document each, with the Gutenberg license
  header and footer removed (the body lies between the ``*** START OF ... PROJECT GUTENBERG ...``
  and ``*** END OF ... PROJECT GUTENBERG ...`` lines; the closing "End of (the) Project
  Gutenberg ..." line just before the end marker is removed as well).
  validation = pg345 (Dracula), test = pg98 (A Tale of Two Cities), train = the other nine.
* ``wikitext-2``: WikiText-2 raw (Merity et al. 2016), validation and test only (the train split
  is not shipped). One document per Wikipedia article: an article starts at a top-level heading
  line `` = Title = `` (exactly one ``=`` each side; `` = = Sub = = `` lines are subsections and
  stay in the article). The document text is the file's lines from that heading up to the next
  one, unchanged.
* ``tinyshakespeare``: one text (Karpathy's char-rnn excerpt), split by lines into the first 90%
  (train), the next 5% (validation) and the last 5% (test); each split is one document.
"""

from __future__ import annotations

import dataclasses
import lzma
import os
import re
from pathlib import Path

SPLITS = ("train", "validation", "test")

_BOOKS_VALIDATION = ("pg345_stoker_dracula",)
_BOOKS_TEST = ("pg98_dickens_tale_of_two_cities",)
_BOOKS_TRAIN = (
    "pg1184_dumas_count_of_monte_cristo",
    "pg135_hugo_les_miserables",
    "pg1400_dickens_great_expectations",
    "pg1497_plato_republic",
    "pg2554_dostoevsky_crime_and_punishment",
    "pg2600_tolstoy_war_and_peace",
    "pg2701_melville_moby_dick",
    "pg3207_hobbes_leviathan",
    "pg3600_montaigne_essays",
)

# corpus -> split -> the split's files (relative to data_dir, without the ".xz" suffix)
CORPUS_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "books": {
        "train": tuple(f"books/{b}.txt" for b in _BOOKS_TRAIN),
        "validation": tuple(f"books/{b}.txt" for b in _BOOKS_VALIDATION),
        "test": tuple(f"books/{b}.txt" for b in _BOOKS_TEST),
    },
    "wikitext-2": {
        "validation": ("wikitext-2/wiki.valid.raw",),
        "test": ("wikitext-2/wiki.test.raw",),
    },
    "tinyshakespeare": {
        "train": ("tinyshakespeare/input.txt",),
        "validation": ("tinyshakespeare/input.txt",),
        "test": ("tinyshakespeare/input.txt",),
    },
}

CORPORA = tuple(CORPUS_FILES)

# tinyshakespeare line split: [0, 90%) train, [90%, 95%) validation, [95%, 100%) test
_SHAKESPEARE_FRACTIONS = {"train": (0.0, 0.90), "validation": (0.90, 0.95), "test": (0.95, 1.0)}

_PG_START = re.compile(r"^\*\*\*\s*START OF .*PROJECT GUTENBERG.*$", re.MULTILINE)
_PG_END = re.compile(r"^\*\*\*\s*END OF .*PROJECT GUTENBERG.*$", re.MULTILINE)
_PG_TRAILER = re.compile(r"^End of (the )?Project Gutenberg", re.MULTILINE | re.IGNORECASE)
# A top-level WikiText heading: " = Title = " with a single '=' on each side.
_WIKI_ARTICLE = re.compile(r"^ = [^=](.*[^=])? = $")


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: scored on its own and never split across a store's document boundary.

    Attributes:
      name: a short identifier (book file stem, article title, or ``<corpus>/<split>``).
      text: the document's text, exactly as it will be tokenized.
    """

    name: str
    text: str


def corpus_splits(corpus: str) -> tuple[str, ...]:
    """The splits available for ``corpus`` (a subset of ``SPLITS``, in that order).

    Raises:
      ValueError: ``corpus`` is unknown (the message lists the known corpora).
    """
    if corpus not in CORPUS_FILES:
        raise ValueError(f"unknown corpus {corpus!r}; known corpora: {', '.join(CORPORA)}")
    return tuple(s for s in SPLITS if s in CORPUS_FILES[corpus])


def read_text(path: str | os.PathLike[str]) -> str:
    """Read a UTF-8 text file (xz-compressed when the name ends in ``.xz``); a leading BOM is dropped.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: the file is not valid xz data, or not valid UTF-8 (naming the byte offset
        in the decompressed data).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected a UTF-8 text file)")
    if path.suffix == ".xz":
        try:
            with lzma.open(path) as f:
                raw = f.read()
        except lzma.LZMAError as e:
            raise ValueError(f"{path}: not a valid xz-compressed file ({e})") from None
    else:
        raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = " of the decompressed data" if path.suffix == ".xz" else ""
        raise ValueError(
            f"{path}: not valid UTF-8 at byte offset {e.start}{where} ({e.reason})"
        ) from None
    return text.removeprefix("\ufeff")


def _corpus_file(data_dir: str | os.PathLike[str], rel: str, corpus: str) -> Path:
    """The path of a corpus file: ``<rel>.xz`` or, failing that, the decompressed ``<rel>``."""
    xz = Path(data_dir) / f"{rel}.xz"
    if xz.is_file():
        return xz
    plain = Path(data_dir) / rel
    if plain.is_file():
        return plain
    raise FileNotFoundError(
        f"{xz}: missing data file; expected the xz-compressed {Path(rel).name} of corpus "
        f"{corpus!r} there (or its decompressed copy {plain}); data_dir={data_dir}"
    )


def strip_gutenberg(text: str, source: str = "<text>") -> str:
    """The body of a Project Gutenberg e-text: between the START and END marker lines.

    Leading and trailing blank lines are dropped, as is the closing "End of (the) Project
    Gutenberg ..." paragraph that sits just before the END marker.

    Raises:
      ValueError: a marker line is missing, or the body is empty (naming ``source``).
    """
    start = _PG_START.search(text)
    if start is None:
        raise ValueError(f"{source}: no '*** START OF ... PROJECT GUTENBERG ...' line")
    end = _PG_END.search(text, start.end())
    if end is None:
        raise ValueError(f"{source}: no '*** END OF ... PROJECT GUTENBERG ...' line after the START line")
    body = text[start.end():end.start()]
    trailers = list(_PG_TRAILER.finditer(body))
    if trailers and not body[trailers[-1].start():].strip().count("\n\n"):
        body = body[:trailers[-1].start()]
    body = body.strip("\n")
    if not body.strip():
        raise ValueError(f"{source}: the Project Gutenberg body is empty")
    return body + "\n"


def split_wikitext_articles(text: str) -> list[Document]:
    """Split WikiText raw text into articles at top-level `` = Title = `` heading lines.

    Text before the first heading is dropped when it is only whitespace (the raw files begin
    with one blank line ``" \\n"``); otherwise it is kept as a document named ``"(preamble)"``.
    """
    docs: list[Document] = []
    title, lines = "(preamble)", []
    for line in text.splitlines(keepends=True):
        m = _WIKI_ARTICLE.match(line.rstrip("\n"))
        if m is not None:
            if lines and (docs or "".join(lines).strip()):
                docs.append(Document(title, "".join(lines)))
            title, lines = line.strip()[2:-2].strip(), []
        lines.append(line)
    if lines and (docs or "".join(lines).strip()):
        docs.append(Document(title, "".join(lines)))
    return docs


def _split_lines(text: str, split: str) -> str:
    lines = text.splitlines(keepends=True)
    lo, hi = _SHAKESPEARE_FRACTIONS[split]
    return "".join(lines[int(round(lo * len(lines))):int(round(hi * len(lines)))])


def load_documents(corpus: str, split: str, data_dir: str | os.PathLike[str]) -> list[Document]:
    """The documents of one split of an embedded corpus, in a fixed order.

    Args:
      corpus: one of ``CORPORA`` ("books", "wikitext-2", "tinyshakespeare").
      split: one of ``SPLITS`` available for the corpus ("train", "validation", "test").
      data_dir: the directory holding the corpus directories (``c.data.data_dir``).

    Returns:
      The documents; the token store keeps them in this order.

    Raises:
      ValueError: unknown corpus or split (listing the valid ones), a split the corpus does not
        ship (wikitext-2 train), a file that is not valid UTF-8 (file and byte offset), or a
        split with no text.
      FileNotFoundError: a data file is missing (naming the path and what belongs there).
    """
    available = corpus_splits(corpus)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if split not in available:
        raise ValueError(
            f"corpus {corpus!r} has no {split!r} split (available: {', '.join(available)}); "
            f"see {Path(data_dir) / corpus / 'SOURCES.md'}"
        )
    docs: list[Document] = []
    for rel in CORPUS_FILES[corpus][split]:
        path = _corpus_file(data_dir, rel, corpus)
        text = read_text(path)
        if corpus == "books":
            docs.append(Document(Path(rel).stem.removesuffix(".txt"), strip_gutenberg(text, str(path))))
        elif corpus == "wikitext-2":
            docs.extend(split_wikitext_articles(text))
        else:  # tinyshakespeare
            docs.append(Document(f"{corpus}/{split}", _split_lines(text, split)))
    docs = [d for d in docs if d.text]
    if not any(d.text.strip() for d in docs):
        raise ValueError(f"corpus {corpus!r} split {split!r} in {data_dir}: no text (empty files?)")
    return docs


def load_text_file(path: str | os.PathLike[str]) -> list[Document]:
    """A user's plain UTF-8 text file (``.xz`` accepted) as one document named after the file.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: not valid UTF-8 (with the byte offset), or empty / whitespace only.
    """
    text = read_text(path)
    if not text.strip():
        raise ValueError(f"{path}: the file contains no text (it is empty or only whitespace)")
    return [Document(Path(path).name, text)]
