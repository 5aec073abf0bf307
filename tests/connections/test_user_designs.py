"""A design of the user's own: registered from their module (checked: a name the grammar reads, patterns, no name
taken by a built-in design, alias or norm unless replaced on purpose), and known to the command line through
SKIPLAB_IMPORT."""

import dataclasses
import json
import re
import sys
import textwrap

import pytest
import torch
from torch import nn

from skiplab.cli import main
from skiplab.connections.across.base import AcrossDesign, register_across
from skiplab.connections.base import ACROSS, REGISTRY, Connection, register
from skiplab.models import build_model, model_config
from skiplab.models.presets import model_from_checkpoint
from skiplab.run_dir import RunDirError

GATE = '''
import torch
from torch import nn
from skiplab.connections.base import Connection, register


@register
class GSkip(Connection):
    """y = x + g F(x), g learned from 1."""

    name = "GSkip"
    patterns = {"GSkip": "y = x + g F(x), g learned from 1"}

    def __init__(self, spec, dim, layout="seq", in_dim=None, place=None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.g = nn.Parameter(torch.ones(()))

    def forward(self, x, branch, skip=None):
        return (x if skip is None else skip(x)) + self.g * branch(x)

    def stats(self):
        return {"g": self.g.item()}
'''


@pytest.fixture
def registries():
    """The registries as they were, after the test (registering adds to the module-level dicts in place)."""
    before = dict(REGISTRY), dict(ACROSS)
    yield
    for now, then in zip((REGISTRY, ACROSS), before):
        now.clear()
        now.update(then)


def make(name, patterns=True, base=Connection):
    attrs = {"name": name, "forward": lambda self, x, branch, skip=None: x + branch(x)}
    if patterns:
        attrs["patterns"] = {name: "y = x + F(x)"}
    return type(f"Mine{name}", (base,), attrs)


@pytest.mark.parametrize("name,problem", [
    ("SAS", "the name 'SAS' is a design's already (@register(replace=True) replaces it on purpose)"),
    ("Residual", "the name 'Residual' is an alias's already"),
    ("RMS", "the name 'RMS' is a norm's already"),
    ("ValueRes", "the name 'ValueRes' is a design's already"),
    ("Gate2", "a design's name is letters alone (what a spec can write), got 'Gate2'"),
    ("my_gate", "a design's name is letters alone"),
])
def test_a_name_the_grammar_cannot_read_or_that_is_taken_is_refused(name, problem):
    before = dict(REGISTRY)
    with pytest.raises(ValueError, match=re.escape(problem)) as err:
        register(make(name))
    assert "\n" not in str(err.value) and REGISTRY == before  # SAS still builds the built-in SAS


def test_a_design_without_patterns_is_refused_and_breaks_nothing():
    """Registered without patterns, one class broke every later parse (``skiplab connections`` read them all)."""
    with pytest.raises(ValueError, match="MineNoPat: give patterns"):
        register(make("NoPat", patterns=False))
    assert "NoPat" not in REGISTRY and main(["connections", "PreLN", "--dim", "4"]) == 0


def test_registering_again_or_replacing_on_purpose(registries):
    cls = make("Twice")
    assert register(cls) is cls and register(cls) is cls  # the same class again: no change
    with pytest.raises(ValueError, match="'Twice' is a design's already"):
        register(make("Twice"))
    other = make("Twice")
    assert register(replace=True)(other) is other and REGISTRY["Twice"] is other
    with pytest.raises(ValueError, match="'Twice' is a design's already"):
        register_across(make("Twice", base=AcrossDesign))  # another kind's name: never replaced
    assert "Twice" not in ACROSS


def test_the_command_line_knows_a_design_its_module_registers(tmp_path, monkeypatch, capsys, registries):
    monkeypatch.delitem(sys.modules, "mydesigns", raising=False)
    (tmp_path / "mydesigns.py").write_text(textwrap.dedent(GATE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SKIPLAB_IMPORT", raising=False)
    assert main(["connections", "GSkip", "--dim", "4"]) == 2
    assert "unknown name 'GSkip'" in capsys.readouterr().err
    monkeypatch.setenv("SKIPLAB_IMPORT", "mydesigns")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["connections", "GSkip", "--dim", "4"]) == 0
    assert "GSkip" in capsys.readouterr().out
    monkeypatch.setenv("SKIPLAB_IMPORT", "mydesigns, nosuchmodule")
    assert main(["connections"]) == 2
    assert capsys.readouterr().err == ("skiplab: error: $SKIPLAB_IMPORT: cannot import 'nosuchmodule' (No module "
                                       "named 'nosuchmodule')\n")


def test_a_checkpoint_of_a_design_not_registered_here_says_so(registries):
    cls = register(make("Gone"))
    cfg = model_config("gpt-mini", d_model=16, heads=2, layers=1, ffn_dim=32, context=8, vocab_size=20,
                       connection="Gone")
    model = build_model(cfg)
    ckpt = {"config": {"model": "gpt-mini(d_model=16,heads=2,layers=1,ffn_dim=32,context=8,connection=Gone)"},
            "model_config": json.loads(json.dumps(dataclasses.asdict(cfg))), "model": model.state_dict()}
    assert isinstance(model_from_checkpoint(ckpt, "run"), nn.Module)
    del REGISTRY["Gone"]
    with pytest.raises(RunDirError, match=re.escape("run: the run's design is not known here (bad connection spec "
                                                    "'Gone': unknown name 'Gone'); a design of your own is known once "
                                                    "its module is imported (SKIPLAB_IMPORT=MODULE")):
        model_from_checkpoint(ckpt, "run")
    assert cls.name == "Gone" and torch.is_tensor(next(iter(ckpt["model"].values())))
