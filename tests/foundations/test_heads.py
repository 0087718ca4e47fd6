"""Head names, the per-head grid and heads given in TransformerLens's conventions."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.errors import TLGeometryError
from tl_geometry.heads import head_columns, head_name, head_names, parse_head, parse_heads


def test_a_head_is_named_by_layer_and_index():
    assert head_name(12, 3) == "L12H3"
    assert head_name(torch.tensor(2), torch.tensor(0)) == "L2H0"


@pytest.mark.parametrize("n_layers,n_heads", [(1, 1), (3, 4), (30, 9)])
def test_the_grid_is_layer_major_as_torch_flattens_a_layer_head_tensor(n_layers, n_heads):
    columns = head_columns(n_layers, n_heads)
    grid = torch.cartesian_prod(torch.arange(n_layers), torch.arange(n_heads))
    assert columns["layer"].tolist() == grid[:, 0].tolist() and columns["head"].tolist() == grid[:, 1].tolist()
    assert str(columns["layer"].dtype) == "int64"
    flat = torch.arange(n_layers * n_heads).reshape(n_layers, n_heads)  # row i of a table is flat[i]
    assert [parse_head(name, n_layers, n_heads) for name in columns["name"]] == \
        [divmod(int(i), n_heads) for i in flat.flatten()]
    assert sum(head_names(n_layers, n_heads), []) == columns["name"]


def test_every_convention_names_the_same_heads():
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[1, 2] = mask[0, 1] = True
    expected = [(0, 1), (1, 2)]
    for heads in (["L0H1", "L1H2"], [(0, 1), (1, 2)], [1, 6], torch.tensor([1, 6]), torch.tensor([[0, 1], [1, 2]]), mask):
        assert parse_heads(heads, 2, 4) == expected


@pytest.mark.parametrize("heads", [(1, 2), ["L2H0"], [8], torch.tensor([0.5]), torch.zeros(3, 4, dtype=torch.bool)])
def test_ambiguous_or_out_of_range_heads_are_refused(heads):
    with pytest.raises(TLGeometryError):
        parse_heads(heads, 2, 4)
