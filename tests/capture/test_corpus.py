"""Corpora and windows: offline default, files, deterministic hashed windows, errors."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.capture.corpus import Corpus, load_corpus, make_windows
from tl_geometry.errors import TLGeometryError


class CharTokenizer:
    """One token per character (ids 3..), BOS = 1: enough to test windowing exactly."""

    bos_token_id = 1

    def __call__(self, text, add_special_tokens=True):
        ids = [3 + (ord(c) % 90) for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}


def test_offline_default_corpus_ships_with_python():
    corpus = load_corpus("python-reference")
    assert len(corpus.documents) > 50 and all(text.strip() for _, text in corpus.documents)


def test_second_offline_corpus_is_news_prose():
    corpus = load_corpus("lee-news")
    assert corpus.name == "lee-news" and len(corpus.documents) == 300  # Lee et al. 2005: 300 articles
    assert corpus.documents[0][1].startswith("Hundreds of people have been forced to vacate their homes")
    python_words = sum(text.count("def ") + text.count("class ") for _, text in load_corpus("python-reference").documents)
    news_words = sum(text.count("def ") + text.count("class ") for _, text in corpus.documents)
    assert news_words * 20 < python_words  # a different domain: no code
    windows = make_windows(CharTokenizer(), corpus, seq_len=300, n_windows=8)
    assert windows.tokens.shape == (8, 300) and (windows.tokens[:, 0] == 1).all()


def test_txt_and_jsonl_files(tmp_path):
    txt = tmp_path / "docs.txt"
    txt.write_text("first document\nstill first\n\nsecond document\n\n\n")
    assert [text for _, text in load_corpus(txt).documents] == ["first document\nstill first", "second document"]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"text": "alpha"}\n{"id": "x", "text": "beta"}\n')
    assert load_corpus(jsonl).documents == [("0", "alpha"), ("x", "beta")]
    (tmp_path / "bad.jsonl").write_text('{"body": 1}\n')
    with pytest.raises(TLGeometryError, match="'text' string"):
        load_corpus(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("no-such-corpus")


def test_windows_are_bos_plus_content_and_deterministic():
    docs = [(str(i), "abcdefghijklmnopqrstuvwxyz"[i:] * 3) for i in range(6)] + [("short", "ab")]
    corpus = Corpus("toy", docs)
    tok = CharTokenizer()
    a = make_windows(tok, corpus, seq_len=9, n_windows=10, seed=3)
    b = make_windows(tok, corpus, seq_len=9, n_windows=10, seed=3)
    c = make_windows(tok, corpus, seq_len=9, n_windows=10, seed=4)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert a.tokens.shape == (10, 9) and (a.tokens[:, 0] == 1).all()
    assert a.skipped_documents == 1 and "short" not in a.doc_ids
    for row, doc_id, offset in zip(a.tokens, a.doc_ids, a.offsets, strict=True):
        content = tok(dict(docs)[doc_id], add_special_tokens=False)["input_ids"]
        assert row[1:].tolist() == content[offset:offset + 8]
    assert len(set(zip(a.doc_ids, a.offsets, strict=True))) == 10  # no duplicate window


def test_corpus_too_short_is_a_clear_error():
    with pytest.raises(ValueError, match="no document of at least 99 tokens"):
        make_windows(CharTokenizer(), Corpus("toy", [("0", "tiny")]), seq_len=100, n_windows=2)


def test_online_corpus_offline_names_alternatives(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ModuleNotFoundError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(TLGeometryError, match="python-reference"):
        load_corpus("wikitext-103")


def test_file_corpora_any_case_suffix_and_a_byte_order_mark(tmp_path):
    (tmp_path / "a.TXT").write_bytes("\ufefffirst document\n\nsecond".encode("utf-8"))
    (tmp_path / "b.jsonl").write_bytes('\ufeff{"text": "one"}\n{"text": "two"}\n'.encode("utf-8"))
    assert [text for _, text in load_corpus(tmp_path / "a.TXT").documents] == ["first document", "second"]
    assert [text for _, text in load_corpus(tmp_path / "b.jsonl").documents] == ["one", "two"]


@pytest.mark.parametrize("spec, message", [("", "is empty"), (" ", "is empty"), ("{dir}", "is a folder")])
def test_paths_that_are_no_corpus_file_say_what_they_are(tmp_path, spec, message):
    with pytest.raises(TLGeometryError, match=message):
        load_corpus(spec.replace("{dir}", str(tmp_path)))


def test_fewer_windows_than_asked_warn_with_the_count():
    corpus = Corpus("tiny", [("a", "x" * 12), ("b", "y" * 12)])
    with pytest.warns(UserWarning, match=r"gave \d+ distinct windows of 10 tokens, not the 500 asked"):
        windows = make_windows(CharTokenizer(), corpus, seq_len=10, n_windows=500)
    assert windows.tokens.shape[0] < 500


def test_windows_need_only_the_documents_they_use():
    # the first round tokenises documents only until it has its windows
    seen = []

    class Counting(CharTokenizer):
        def __call__(self, text, add_special_tokens=True):
            seen.append(text)
            return super().__call__(text, add_special_tokens)

    corpus = Corpus("many", [(str(i), chr(97 + i % 26) * 40) for i in range(200)])
    make_windows(Counting(), corpus, seq_len=16, n_windows=3)
    assert len(seen) == 3
