"""The tl-geometry command line: one-line errors with exit code 2, and the smoke run."""

from __future__ import annotations

import pytest

from tl_geometry.cli import main


def test_unknown_model_is_one_line_error(capsys):
    assert main(["analyze", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'no-such-model'" in err and "smollm2-135m" in err


@pytest.mark.slow
def test_analyze_smoke_prints_every_layer(capsys, smollm2):
    assert main(["analyze"]) == 0
    out = capsys.readouterr().out
    assert out.count("layer ") == 30 and "pattern (1, 9," in out
