"""Depth-scaled branches of the pre-norm family: y = x + (L/L_base)^(−α) F(G(x)), L the stack's layers (depth-μP at
α = ½, CompleteP at α = 1), against the multiplier computed by hand."""

import pytest
import torch

from skiplab.connections import Place, SpecError, connection, parse_spec
from skiplab.connections import prenorm
from skiplab.connections.base import REGISTRY
from skiplab.connections.spec import format_spec


def branch(h):
    return torch.tanh(h) * 3.0 + 0.5


@pytest.mark.parametrize("spec, layers, expected", [
    ("PreLN(depth_alpha=0.5,depth_base=2)", 8, 0.5),   # (8/2)^(-1/2)
    ("PreLN(depth_alpha=1,depth_base=2)", 8, 0.25),    # (8/2)^(-1)
    ("PreRMS(depth_alpha=1,depth_base=4)", 4, 1.0),    # at the base depth: 1
    ("PreDyT(depth_alpha=1)", 3, 1 / 3),               # L_base 1
    ("PreLN(depth_alpha=2,depth_base=6)", 3, 4.0),     # shallower than the base: > 1
])
def test_the_branch_is_scaled_by_the_depth_multiplier_computed_by_hand(spec, layers, expected):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    for layer in (1, layers):  # the same multiplier at every layer of the stack
        conn = connection(spec, 16, place=Place.decoder_only(layer, layers, 1, 2, "attn"))
        plain = connection(spec.split("(")[0], 16, place=Place.decoder_only(layer, layers, 1, 2, "attn"))
        plain.load_state_dict(conn.state_dict())
        y = conn(x, branch)
        assert torch.allclose(y, x + expected * branch(conn.norm(x)), atol=1e-6)
        assert torch.allclose(y - x, expected * (plain(x, branch) - x), atol=1e-6)
        assert conn.stats()["depth_multiplier"] == pytest.approx(expected)


def test_lns_takes_the_depth_scaling_with_its_own_1_over_sqrt_l():
    x = torch.randn(2, 3, 8)
    conn = connection("LNS+RMS(depth_alpha=0.5,depth_base=2)", 8, place=Place.decoder_only(4, 8, 1, 2, "attn"))
    assert conn.spec == "PreRMS(scale=depth,depth_alpha=0.5,depth_base=2)"
    assert torch.allclose(conn(x, branch), x + 0.5 * branch(conn.norm(x) / 2.0), atol=1e-6)  # √4 = 2, (8/2)^-½


def test_the_multiplier_mutated_is_caught(monkeypatch):
    """The comparison above fails where the multiplier is (L/L_base)^(+α) rather than ^(−α)."""
    monkeypatch.setattr(prenorm, "depth_multiplier", lambda layers, alpha, base: (layers / base) ** alpha)
    x = torch.randn(2, 3, 8)
    conn = connection("PreLN(depth_alpha=1,depth_base=2)", 8, place=Place.decoder_only(1, 8))
    assert not torch.allclose(conn(x, branch), x + 0.25 * branch(conn.norm(x)), atol=1e-6)


@pytest.mark.parametrize("spec", ["PreLN", "PreRMS", "PreDyT", "LNS", "PreLN(scale=depth)"])
def test_the_defaults_change_nothing_and_are_left_out_of_the_spec(spec):
    parsed = parse_spec(spec)
    assert parsed.options["depth_alpha"] == 0.0 and parsed.options["depth_base"] == 1.0
    assert format_spec(parsed, REGISTRY[parsed.name]) == spec
    assert format_spec(parse_spec(spec.replace(")", ",depth_alpha=0)") if "(" in spec else spec + "(depth_alpha=0)"),
                       REGISTRY[parsed.name]) == spec
    conn = connection(spec, 8, place=Place.decoder_only(3, 12))
    assert conn.multiplier == 1.0 and "depth_multiplier" not in conn.stats()


@pytest.mark.parametrize("text, problem", [
    ("PreLN(depth_alpha=-1)", "depth_alpha: must be a finite number >= 0"),
    ("PreLN(depth_base=0)", "depth_base: must be a finite number > 0"),
    ("1xSkip+LN(depth_alpha=1)", "has no option 'depth_alpha'"),
])
def test_bad_values_are_one_line(text, problem):
    with pytest.raises(SpecError, match=problem) as err:
        parse_spec(text)
    assert "\n" not in str(err.value)
