"""One keyed checkpoint for every long job: what cannot be resumed is refused when the checkpoint
is opened (before any forward), a full disk is one line and leaves neither a ``.tmp`` nor a
changed old state, and the analysis, the single-head scan and the streaming curves all use it."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import TLGeometryError
from tl_geometry.run.checkpoint import KeyedCheckpoint

from ..tiny import random_tokens, tiny_model, tiny_streamable
from .test_run_folder import snapshot

KEY = {"model": "m", "tokens": "abc"}


def test_state_comes_back_exactly(tmp_path):
    state = KeyedCheckpoint(tmp_path / "c.safetensors", KEY, "streaming curve")
    assert state.problem() is None and state.load() == ({}, {})
    state.save({"x": torch.arange(3.0)}, {"nll": {"1,2": 0.1 + 0.2}})
    tensors, saved = KeyedCheckpoint(tmp_path / "c.safetensors", dict(reversed(KEY.items())), "streaming curve").load()
    assert torch.equal(tensors["x"], torch.arange(3.0)) and saved == {"nll": {"1,2": 0.1 + 0.2}}  # exact floats


def _json_checkpoint(path):
    path.write_text('[["an earlier version", 1]]')  # the JSON checkpoints of earlier versions, list-shaped


def _truncated(path):
    KeyedCheckpoint(path, KEY, "analysis").save({"x": torch.zeros(100)})
    path.write_bytes(path.read_bytes()[:50])


# (how the path is prepared, the path given, what cannot be resumed, said when opened or when loaded)
CASES = {
    "a folder": (lambda p: p.mkdir(), "c", "is a folder: pass a file path"),
    "a missing folder": (None, "missing/c.safetensors", "does not exist or is not writable"),
    "a damaged file": (lambda p: p.write_bytes(b"\x00" * 40), "c", "it is damaged, truncated or not a checkpoint"),
    "a truncated file": (_truncated, "c", "it is damaged, truncated or not a checkpoint"),
    "an old JSON checkpoint": (_json_checkpoint, "c", "it is damaged, truncated or not a checkpoint"),
    "another job's": (lambda p: KeyedCheckpoint(p, KEY, "top-N deletion").save({}), "c",
                      "it holds the state of another job (top-N deletion)"),
    "other settings": (lambda p: KeyedCheckpoint(p, {**KEY, "tokens": "xyz"}, "analysis").save({}), "c",
                       "it was written by an analysis with other settings"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_cannot_be_resumed_is_one_line_and_changes_nothing(case, tmp_path):
    prepare, name, message = CASES[case]
    if prepare is not None:
        prepare(tmp_path / name)
    before = snapshot(tmp_path)
    with pytest.raises(TLGeometryError) as error:
        KeyedCheckpoint(tmp_path / name, KEY, "analysis").load()
    assert message in str(error.value) and "\n" not in str(error.value)
    assert snapshot(tmp_path) == before


def test_a_full_disk_leaves_the_old_state_and_no_tmp(tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    state = KeyedCheckpoint(tmp_path / "c.safetensors", KEY, "analysis")
    state.save({"x": torch.ones(2)})
    before = snapshot(tmp_path)

    def full(tensors, filename, metadata=None):
        open(filename, "wb").write(b"half")  # noqa: SIM115 - what a disk filling up leaves
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(TLGeometryError, match="cannot write .*c.safetensors .*No space left on device.*free space"):
        state.save({"x": torch.zeros(2)})
    assert snapshot(tmp_path) == before  # the old state, whole; no .tmp beside it


# Every job that keeps a checkpoint refuses one it cannot resume before its first forward.
def _stream(model, tokens, path):
    return tlg.intervene.streaming_curve(model, tokens, fractions=0.5, window=4, sink=1, orders="random", seeds=1,
                               checkpoint=path, progress=False)


def _scan(model, tokens, path):
    return tlg.intervene.single_head_scan(model, tokens, checkpoint=path, progress=False)


def _analyze(model, tokens, path):
    return tlg.analyze(model, tokens, 1, repeats=1, checkpoint=path, progress=False)


JOBS = {"streaming curve": _stream, "single-head scan": _scan, "analysis": _analyze}


def _runnable(job):
    """A tiny model the job can run on: streaming needs attention patterns it can override."""
    return tiny_streamable(4, 2) if job == "streaming curve" else tiny_model(4, 2)


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("case", ["a folder", "a missing folder", "a damaged file", "an old JSON checkpoint",
                                  "another job's"])
def test_every_job_refuses_before_any_forward(job, case, tmp_path, monkeypatch):
    prepare, name, message = CASES[case]
    if prepare is not None:
        prepare(tmp_path / name)
    model, tokens = tiny_model(4, 2), random_tokens(2, 12, seed=1)
    before = snapshot(tmp_path)

    def no_forward(*args, **kwargs):
        raise AssertionError("a forward ran before the checkpoint was checked")

    monkeypatch.setattr(model, "forward", no_forward)
    with pytest.raises(TLGeometryError) as error:
        JOBS[job](model, tokens, tmp_path / name)
    assert message in str(error.value), str(error.value)
    assert snapshot(tmp_path) == before


def test_one_order_and_one_fraction_alone_are_not_split(tmp_path):
    curve = _stream(_runnable("streaming curve"), random_tokens(2, 12, seed=1), None)
    assert list(curve.delta_nll) == ["random"] and curve.fractions == (0.5,)


@pytest.mark.parametrize("job", list(JOBS))
def test_a_full_disk_at_a_jobs_first_write_is_one_line_and_leaves_no_tmp(job, tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        open(filename, "wb").write(b"half")  # noqa: SIM115
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(TLGeometryError, match="No space left on device"):
        JOBS[job](_runnable(job), random_tokens(2, 12, seed=1), tmp_path / "c.safetensors")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change", ["another dtype", "weights edited in place"])
@pytest.mark.parametrize("job", list(JOBS))
def test_a_checkpoint_of_other_weights_is_never_resumed(job, change, tmp_path):
    # the key holds the model's dtype and a fingerprint of its weights: a bfloat16 model does not
    # resume a float32 one's evaluations, nor an edited model the original's
    model, tokens = _runnable(job), random_tokens(2, 12, seed=1)
    path = tmp_path / "c.safetensors"
    JOBS[job](model, tokens, path)
    if change == "another dtype":
        model = model.to(torch.bfloat16)
    else:
        with torch.no_grad():
            next(model.parameters())[0].add_(1.0)
    with pytest.raises(TLGeometryError, match="written by an? .* with other settings"):
        JOBS[job](model, tokens, path)
