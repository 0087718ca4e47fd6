"""Corpora and fixed-length windows (docs/metrics.md#windows).

A corpus is an ordered list of ``(doc_id, text)``. Two corpora of different domains need no
network (``docs/design.md`` says why these):

* ``"python-reference"`` (the default): the Python Language Reference that ships with every
  CPython as ``pydoc_data.topics`` (79 documents, ~465k characters of technical English prose
  with code);
* ``"lee-news"``: the Lee, Pincombe & Welsh (2005) corpus of 300 ABC news articles (~360k
  characters of general-news English), shipped inside the ``gensim`` wheel as test data and
  read from its files (``pip install --no-deps gensim``; gensim itself is never imported).

Example:
    >>> corpus = load_corpus("python-reference")
    >>> corpus.name, len(corpus.documents) > 50
    ('python-reference', True)
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from ..errors import TLGeometryError

__all__ = ["Corpus", "Windows", "load_corpus", "make_windows", "OFFLINE_CORPORA"]

OFFLINE_CORPORA = ("python-reference", "lee-news")
ONLINE_CORPORA = {"wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1"), "openwebtext": ("Skylion007/openwebtext", None)}


@dataclass
class Corpus:
    """Named, ordered documents."""

    name: str
    documents: list[tuple[str, str]]  # (doc_id, text)


@dataclass
class Windows:
    """``tokens [n_windows, seq_len]``: BOS then ``seq_len − 1`` content tokens of one document."""

    tokens: Int[Tensor, "window pos"]
    doc_ids: list[str]
    offsets: list[int]
    corpus: str
    seed: int
    skipped_documents: int  # too short for one window

    def describe(self) -> dict[str, Any]:
        return {"corpus": self.corpus, "n_windows": int(self.tokens.shape[0]), "seq_len": int(self.tokens.shape[1]),
                "seed": self.seed, "documents": len(set(self.doc_ids)), "skipped_documents": self.skipped_documents}


def _python_reference() -> Corpus:
    from pydoc_data import topics

    return Corpus("python-reference", [(key, text) for key, text in sorted(topics.topics.items())])


def _lee_news() -> Corpus:
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("gensim")
    except importlib.metadata.PackageNotFoundError:
        raise TLGeometryError(
            "corpus 'lee-news' is read from the gensim wheel, which is not installed: pip install --no-deps "
            "gensim==4.4.0, or use the corpus 'python-reference'"
        ) from None
    path = Path(dist.locate_file("gensim/test/test_data/lee_background.cor"))
    if not path.is_file():
        raise TLGeometryError(f"gensim {dist.version} has no {path.name}; install gensim==4.4.0.")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return Corpus("lee-news", [(f"lee-{i:03d}", line) for i, line in enumerate(lines) if line])


def _read_text(path: Path) -> str:
    try:  # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the text
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TLGeometryError(f"corpus file {str(path)!r} is not UTF-8 text (byte {exc.start}): convert it, e.g. "
                              "iconv -t UTF-8.") from None
    except OSError as exc:
        raise TLGeometryError(f"cannot read corpus file {str(path)!r} ({exc.strerror}).") from None


def _from_file(path: Path) -> Corpus:
    if path.is_dir():
        raise TLGeometryError(f"corpus {str(path)!r} is a folder: pass one .txt or .jsonl file.")
    if path.exists() and not path.is_file():
        raise TLGeometryError(f"corpus {str(path)!r} is not a regular file (a pipe or device?): pass a .txt or "
                              ".jsonl file.")
    if not path.is_file():
        raise TLGeometryError(f"corpus file {str(path)!r} does not exist.")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        docs = []
        for number, line in enumerate(_read_text(path).splitlines()):
            if not line.strip():
                continue
            where = f"{path}:{number + 1}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise TLGeometryError(f"{where}: not valid JSON ({exc}); each line must be an object with a "
                                      "'text' string.") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                got = type(record).__name__ if not isinstance(record, dict) else f"text={record.get('text')!r}"
                raise TLGeometryError(f"{where}: each line must be a JSON object with a 'text' string (got {got}).")
            docs.append((str(record.get("id", number)), record["text"]))
    elif suffix in (".txt", ".md", ""):
        blocks = [block.strip() for block in _read_text(path).split("\n\n")]
        docs = [(str(i), block) for i, block in enumerate(blocks) if block]
    else:
        raise TLGeometryError(f"corpus file {path.name!r}: use a .txt (documents separated by blank lines) or .jsonl (a 'text' field).")
    return Corpus(path.stem, docs)


def _from_hub(name: str) -> Corpus:
    repo, config = ONLINE_CORPORA[name]
    try:
        import datasets
    except ModuleNotFoundError:
        raise TLGeometryError(
            f"corpus {name!r} needs the Hugging Face `datasets` package (pip install datasets) and network; "
            f"offline corpora: {', '.join(OFFLINE_CORPORA)}, or a .txt/.jsonl path."
        ) from None
    try:
        data = datasets.load_dataset(repo, config, split="test" if config else "train", streaming=True)
        docs = [(str(i), row["text"]) for i, row in zip(range(20_000), data, strict=False) if row["text"].strip()]
    except Exception as exc:  # offline, hub error, gated dataset
        raise TLGeometryError(
            f"could not load corpus {name!r} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            f"Offline, use {', '.join(OFFLINE_CORPORA)} or a .txt/.jsonl file."
        ) from exc
    return Corpus(name, docs)


def load_corpus(spec: str | Path) -> Corpus:
    """Load a corpus by name (offline: ``python-reference``, ``lee-news``; online:
    ``wikitext-103``, ``openwebtext``) or from a ``.txt`` / ``.jsonl`` path."""
    if isinstance(spec, str) and not spec.strip():
        raise TLGeometryError(f"corpus {spec!r} is empty: pass {', '.join(OFFLINE_CORPORA)} or a path to a .txt/.jsonl "
                              "file.")
    if isinstance(spec, str) and spec == "python-reference":
        corpus = _python_reference()
    elif isinstance(spec, str) and spec == "lee-news":
        corpus = _lee_news()
    elif isinstance(spec, str) and spec in ONLINE_CORPORA:
        corpus = _from_hub(spec)
    elif Path(spec).suffix or Path(spec).exists():
        corpus = _from_file(Path(spec))
    else:
        raise TLGeometryError(
            f"unknown corpus {str(spec)!r}: use {', '.join(OFFLINE_CORPORA + tuple(ONLINE_CORPORA))} "
            "or a path to a .txt/.jsonl file."
        )
    if not corpus.documents:
        raise TLGeometryError(f"corpus {corpus.name!r} is empty: it holds no non-blank document.")
    return corpus


# Characters of one document above which make_windows says that it is tokenised whole.
_LARGE_DOCUMENT = 2_000_000


def _hash(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little")


def make_windows(model_or_tokenizer: Any, corpus: Corpus | str, seq_len: int = 256, n_windows: int = 64,
                 seed: int = 0) -> Windows:
    """Cut ``n_windows`` windows of BOS + ``seq_len − 1`` content tokens (docs/metrics.md#windows).

    Documents are tokenised without special tokens; a document shorter than ``seq_len − 1``
    tokens is skipped (and counted). Documents are visited in a seeded hashed order, and each
    window's offset is a seeded hash of (seed, document id, round), so the windows depend only
    on the corpus, the tokenizer, ``seq_len`` and ``seed``. When there are fewer long-enough
    documents than windows, further rounds take more windows from the same documents.
    """
    tokenizer = getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)
    if tokenizer is None or not callable(tokenizer):
        raise TLGeometryError("make_windows needs a model with a tokenizer, or a Hugging Face tokenizer.")
    if isinstance(corpus, str | Path):
        corpus = load_corpus(corpus)
    if seq_len < 2 or n_windows < 1:
        raise TLGeometryError(f"need seq_len ≥ 2 and n_windows ≥ 1; got seq_len={seq_len}, n_windows={n_windows}.")
    bos = tokenizer.bos_token_id
    if bos is None:
        raise TLGeometryError("the tokenizer has no BOS token; windows start with BOS (the sink). Set tokenizer.bos_token.")
    content = seq_len - 1
    order = sorted(corpus.documents, key=lambda doc: _hash(seed, doc[0]))
    rows, doc_ids, offsets, seen = [], [], [], set()

    def take(doc_id: str, ids: list[int], round_: int) -> None:
        offset = _hash(seed, doc_id, round_) % (len(ids) - content + 1)
        if (doc_id, offset) not in seen:
            seen.add((doc_id, offset))
            rows.append([bos, *ids[offset:offset + content]])
            doc_ids.append(doc_id)
            offsets.append(offset)

    # The first round takes one window per long-enough document, in the seeded order, tokenising
    # each only when it is reached: memory and time follow the windows, not the corpus. Only
    # when the documents run out (more windows than long documents) do later rounds revisit them.
    eligible, skipped = [], 0
    for doc_id, text in order:
        if len(text) > _LARGE_DOCUMENT:
            warnings.warn(f"corpus {corpus.name!r}: document {doc_id!r} holds {len(text) / 1e6:.0f} M characters, "
                          "tokenised whole (a 15 MB document takes about 3 GB); separate its parts by blank lines "
                          "(.txt) or lines (.jsonl) to need less memory.", stacklevel=2)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < content:
            skipped += 1
            continue
        eligible.append((doc_id, ids))
        take(doc_id, ids, 0)
        if len(rows) == n_windows:
            break
    if not eligible:
        raise TLGeometryError(
            f"corpus {corpus.name!r} has no document of at least {content} tokens ({skipped} too short): "
            "lower --seq-len or use a corpus of longer documents."
        )
    for round_ in range(1, 4 * n_windows):
        if len(rows) == n_windows:
            break
        for doc_id, ids in eligible:
            take(doc_id, ids, round_)
            if len(rows) == n_windows:
                break
    if len(rows) < n_windows:
        warnings.warn(f"corpus {corpus.name!r} gave {len(rows)} distinct windows of {seq_len} tokens, not the "
                      f"{n_windows} asked ({len(eligible)} documents long enough, {skipped} too short): the run "
                      "uses those; lower --seq-len or use a larger corpus for more.", stacklevel=2)
    return Windows(torch.tensor(rows, dtype=torch.long), doc_ids, offsets, corpus.name, seed, skipped)
