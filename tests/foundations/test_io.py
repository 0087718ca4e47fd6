"""Results on disk: kinds are checked, writes are atomic, names and digests are stable."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.errors import TLGeometryError
from tl_geometry.io import atomic_path, load_tensors, save_tensors, token_digest


def test_a_file_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    save_tensors(path, "GeometryResult", {"a": torch.arange(3)}, n=[1, 2])
    tensors, meta = load_tensors(path, "GeometryResult")
    assert torch.equal(tensors["a"], torch.arange(3)) and meta == {"n": [1, 2]}
    with pytest.raises(TLGeometryError, match="does not hold a HeadTaxonomy .*GeometryResult"):
        load_tensors(path, "HeadTaxonomy")
    with pytest.raises(TLGeometryError, match="cannot read .*missing"):
        load_tensors(tmp_path / "absent.safetensors", "GeometryResult")


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("killed while writing")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["table.csv"]
    with atomic_path(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_digests():
    tokens = torch.tensor([[1, 2, 3]])
    assert token_digest(tokens) == token_digest(tokens.clone()) != token_digest(tokens + 1)
    assert token_digest(tokens, torch.tensor([[1, 1, 0]])) != token_digest(tokens, torch.tensor([[1, 1, 1]]))


def test_a_refused_write_is_one_clear_error_and_keeps_the_old_file(tmp_path, monkeypatch):
    # a full disk or a read-only folder (simulated: root may write anywhere here)
    import errno
    import os

    path = tmp_path / "report.html"
    path.write_text("old")

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(TLGeometryError, match="cannot write .*report.html .*No space left.*writable folder with free"):
        with atomic_path(path) as tmp:
            tmp.write_text("new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_tensor_files_get_the_mode_every_other_result_file_gets(tmp_path):
    import os

    import torch

    from tl_geometry.io import save_tensors

    save_tensors(tmp_path / "x.safetensors", "K", {"a": torch.ones(2)})
    (tmp_path / "y.csv").write_text("a\n")
    assert os.stat(tmp_path / "x.safetensors").st_mode == os.stat(tmp_path / "y.csv").st_mode
