"""Your own corpus: ``--config.data.corpus=PATH`` instead of an embedded corpus name.

``PATH`` is either

* a folder: every ``*.txt`` file in it (subfolders included) is one document, every ``*.jsonl``
  file holds one document per line (a JSON object whose ``"text"`` field is the document); or
* one ``.jsonl`` file (one document per line) or one ``.txt`` file (one document).

Each file may be compressed (``.gz`` or ``.xz`` after the suffix: ``a.txt.gz``, ``b.jsonl.xz``).
Files are read in sorted order of their path relative to ``PATH``; hidden files and other
extensions are ignored. Text must be UTF-8 (a leading BOM is dropped); whitespace-only documents
are skipped. A document is named by its relative path (``notes/a.txt``), a JSON-lines document by
its file and line (``web.jsonl:17``).

Held-out split (validation and test, each a set of whole documents):

* by name: ``data.validation_files`` / ``data.test_files``, comma-separated relative paths of
  files in the folder (every document of a named file goes to that split; all other files train);
  when either is set, both must be, and the fraction is not used;
* by fraction (default): ``data.heldout_fraction`` (0.1) of the documents, half validation and
  half test (at least one document each). Documents are ranked by the sha256 of their name, so
  the split depends only on the names, never on the order the files were listed in.

The tokenizer is trained on the train split (as for the embedded corpora) and the token stores
are cached under a sha256 of the documents' texts (``titans_lm.data.prepare``): editing, adding
or removing a file builds new stores instead of reusing stale ones.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import ml_collections

from titans_lm.data.corpora import (CORPUS_FILES, SPLITS, Document, corpus_splits,
                                    load_documents, read_text)

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl",)
COMPRESSED = ("", ".gz", ".xz")
TEXT_FIELD = "text"


def is_user_corpus(corpus: str) -> bool:
    """Whether ``data.corpus`` names a path rather than an embedded corpus."""
    return corpus not in CORPUS_FILES


def _kind(path: Path) -> str | None:
    """"txt", "jsonl" or None (not a corpus file), looking through a .gz / .xz suffix."""
    name = path.name.lower()
    for comp in COMPRESSED:
        if comp and not name.endswith(comp):
            continue
        base = name[:len(name) - len(comp)] if comp else name
        if base.endswith(TEXT_SUFFIXES):
            return "txt"
        if base.endswith(JSONL_SUFFIXES):
            return "jsonl"
    return None


def _check_path(corpus: str) -> Path:
    path = Path(corpus).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"data.corpus={corpus!r}: no such file or folder (give a folder of .txt / .jsonl files, "
            f"one .jsonl file, or an embedded corpus: {', '.join(CORPUS_FILES)})")
    return path


def corpus_files(corpus: str) -> list[tuple[str, Path]]:
    """``[(relative name, path)]`` of the corpus's files, sorted by name.

    Raises:
      FileNotFoundError: ``corpus`` does not exist.
      ValueError: it holds no ``.txt`` / ``.jsonl`` file (listing what it does hold).
    """
    path = _check_path(corpus)
    if path.is_file():
        if _kind(path) is None:
            raise ValueError(f"data.corpus={corpus!r}: a corpus file must be .txt or .jsonl "
                             f"(optionally .gz / .xz), got {path.name!r}")
        return [(path.name, path)]
    found, other = [], []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in files:
            p = Path(root) / f
            if f.startswith("."):
                continue
            (found if _kind(p) else other).append((p.relative_to(path).as_posix(), p))
    if not found:
        seen = ", ".join(sorted(n for n, _ in other)[:5]) or "nothing"
        raise ValueError(f"data.corpus={corpus!r}: the folder holds no .txt or .jsonl file "
                         f"(optionally .gz / .xz); found {seen}")
    return sorted(found)


def _read(path: Path) -> str:
    if path.name.lower().endswith(".gz"):
        try:
            raw = gzip.decompress(path.read_bytes())
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: not a valid gzip-compressed file ({e})") from None
        try:
            return raw.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not valid UTF-8 at byte offset {e.start} of the decompressed "
                             f"data ({e.reason})") from None
    return read_text(path)


def _jsonl_documents(name: str, path: Path) -> list[Document]:
    docs = []
    for i, line in enumerate(_read(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get(TEXT_FIELD), str):
            keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise ValueError(f"{path}:{i}: expected an object with a string {TEXT_FIELD!r} field, "
                             f"got {keys}")
        if rec[TEXT_FIELD].strip():
            docs.append(Document(f"{name}:{i}", rec[TEXT_FIELD]))
    return docs


def read_corpus(corpus: str) -> list[tuple[str, list[Document]]]:
    """``[(file name, its documents)]`` for every file of the corpus (whitespace-only dropped).

    Raises:
      FileNotFoundError, ValueError: see :func:`corpus_files`; a file that is not UTF-8 (with the
        byte offset), not valid gzip/xz, or a JSON-lines record without a string ``text``; a
        corpus with no text at all.
    """
    out = []
    for name, path in corpus_files(corpus):
        if _kind(path) == "jsonl":
            docs = _jsonl_documents(name, path)
        else:
            text = _read(path)
            docs = [Document(name, text)] if text.strip() else []
        out.append((name, docs))
    if not any(docs for _, docs in out):
        raise ValueError(f"data.corpus={corpus!r}: no text (every file is empty or whitespace)")
    return out


def _names(value: str) -> list[str]:
    return [n.strip() for n in str(value).split(",") if n.strip()]


def _rank(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def split_documents(files: list[tuple[str, list[Document]]], data_cfg: ml_collections.ConfigDict
                    ) -> dict[str, list[Document]]:
    """Assign documents to ``train`` / ``validation`` / ``test`` (see the module docstring).

    Raises:
      ValueError: a named file that the corpus does not hold, a file named for both splits, only
        one of the two lists given, a fraction outside (0, 1), too few documents for a split, or
        an empty split.
    """
    corpus = data_cfg.corpus
    val_names = _names(data_cfg.get("validation_files", ""))
    test_names = _names(data_cfg.get("test_files", ""))
    out: dict[str, list[Document]] = {s: [] for s in SPLITS}
    if val_names or test_names:
        if not (val_names and test_names):
            raise ValueError("config fields data.validation_files and data.test_files: name the "
                             "held-out files of both splits (comma-separated), or neither to use "
                             "data.heldout_fraction")
        known = {n for n, _ in files}
        for field, names in (("validation_files", val_names), ("test_files", test_names)):
            missing = [n for n in names if n not in known]
            if missing:
                raise ValueError(f"config field data.{field}: {missing} not in {corpus} (its files: "
                                 f"{', '.join(sorted(known)[:8])}{', ...' if len(known) > 8 else ''})")
        both = sorted(set(val_names) & set(test_names))
        if both:
            raise ValueError(f"config fields data.validation_files and data.test_files both name "
                             f"{both}")
        for name, docs in files:
            split = ("validation" if name in val_names else "test" if name in test_names
                     else "train")
            out[split].extend(docs)
    else:
        frac = float(data_cfg.get("heldout_fraction", 0.1))
        if not 0.0 < frac < 1.0:
            raise ValueError(f"config field data.heldout_fraction: must lie in (0, 1), got {frac}")
        docs = [d for _, ds in files for d in ds]
        if len(docs) < 3:
            raise ValueError(
                f"data.corpus={corpus!r} holds {len(docs)} document(s); a held-out split by "
                f"fraction needs at least 3 (train, validation, test). Add files, or split your "
                f"text into several files and name the held-out ones with data.validation_files "
                f"and data.test_files")
        n_val = max(1, round(frac * len(docs) / 2))
        n_test = max(1, round(frac * len(docs)) - n_val)
        ranked = sorted(range(len(docs)), key=lambda i: _rank(docs[i].name))
        held = {i: "validation" for i in ranked[:n_val]}
        held.update({i: "test" for i in ranked[n_val:n_val + n_test]})
        for i, d in enumerate(docs):  # each split keeps the corpus's file order
            out[held.get(i, "train")].append(d)
    for split, docs in out.items():
        if not docs:
            raise ValueError(f"data.corpus={corpus!r}: the {split} split holds no text (its files "
                             f"are empty)")
    return out


def corpus_label(data_cfg: ml_collections.ConfigDict) -> str:
    """A file-name-safe name of the corpus: the embedded name, or ``user-<folder or file name>``."""
    corpus = data_cfg.corpus
    if not is_user_corpus(corpus):
        return corpus
    stem = Path(corpus).expanduser().resolve().name.split(".")[0] or "corpus"
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in stem)
    return f"user-{safe}"


def splits_of(data_cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The splits available for the config's corpus (every split for a user corpus)."""
    return SPLITS if is_user_corpus(data_cfg.corpus) else corpus_splits(data_cfg.corpus)


def load_split(data_cfg: ml_collections.ConfigDict, split: str) -> list[Document]:
    """The documents of one split of ``data_cfg.corpus``, embedded or a path.

    Raises:
      ValueError, FileNotFoundError: as :func:`titans_lm.data.corpora.load_documents` for an
        embedded corpus; as :func:`read_corpus` and :func:`split_documents` for a path.
    """
    if not is_user_corpus(data_cfg.corpus):
        return load_documents(data_cfg.corpus, split, data_cfg.data_dir)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    return split_documents(read_corpus(data_cfg.corpus), data_cfg)[split]


def heldout_lines(label: str, parts: dict[str, list[Document]], shown: int = 5) -> list[str]:
    """What a user corpus holds out, one line per held-out split in ``parts``, naming its first
    ``shown`` documents: ``"user-x/validation holds a.txt, b.txt and 3 more"``."""
    lines = []
    for split in ("validation", "test"):
        if split in parts:
            names = [d.name for d in parts[split]]
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            lines.append(f"{label}/{split} holds {', '.join(names[:shown])}{more}")
    return lines


def absolute_corpus(corpus: str) -> str:
    """An embedded corpus name unchanged; a path made absolute (the run then works from any
    directory, and ``eval`` finds the corpus the checkpoint was trained on)."""
    if not is_user_corpus(corpus):
        return corpus
    return str(Path(corpus).expanduser().resolve())


def resolve_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``cfg`` with ``data.corpus`` made absolute when it is a path (changed in place, returned)."""
    cfg.data.corpus = absolute_corpus(cfg.data.corpus)
    return cfg


def load_splits(data_cfg: ml_collections.ConfigDict, splits) -> dict[str, list[Document]]:
    """:func:`load_split` for several splits, reading a user corpus once."""
    if not is_user_corpus(data_cfg.corpus):
        return {s: load_documents(data_cfg.corpus, s, data_cfg.data_dir) for s in splits}
    bad = [s for s in splits if s not in SPLITS]
    if bad:
        raise ValueError(f"unknown split {bad[0]!r}; valid splits: {', '.join(SPLITS)}")
    parts = split_documents(read_corpus(data_cfg.corpus), data_cfg)
    return {s: parts[s] for s in splits}
