import argparse
import json
import subprocess
import sys

import pytest
import torch

from skiplab import config
from skiplab.cli import build_parser, main


def test_connections_lists_every_design(capsys):
    assert main(["connections"]) == 0
    out = capsys.readouterr().out
    for pattern in ["λxSkip+LN", "krSkip+LN", "wSkip+LN", "SAS(gate=single)", "Highway", "PreRMS", "PostLN"]:
        assert pattern in out


def test_connections_shows_a_parsed_spec(capsys):
    assert main(["connections", "PostLN", "--dim", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PostLN -> 1xSkip+LN: Spec(") and "LayerNorm((4,)" in out
    assert "krSkip+LN" not in out  # the spec asked about, not the whole list


def test_connections_with_a_bad_spec_prints_one_line_and_nothing_else(capsys):
    assert main(["connections", "0xSkip"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("skiplab: error: bad connection spec '0xSkip': λ of xSkip must be a finite number > 0")
    assert main(["connections", ""]) == 2  # an empty spec (a shell variable unset) is not the whole list
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("skiplab: error: bad connection spec '': not of the form")


def test_bad_spec_is_one_line_on_stderr_with_exit_code_2(capsys, tmp_path):
    assert main(["demo", "gradient-flow", "--designs", "1xSkip,3rskip+LN", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'rSkip'" in err
    assert not (tmp_path / "o").exists()  # nothing written for a bad request


def test_demo_gradient_flow_from_the_console_script(tmp_path):
    cmd = [sys.executable, "-m", "skiplab", "demo", "gradient-flow", "--depth", "4", "--width", "8",
           "--designs", "NoSkip,PostLN", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "| PostLN" in res.stdout and (tmp_path / "gradient_flow.png").exists()
    record = json.loads((tmp_path / "gradient_flow.json").read_text())
    assert record["environment"]["torch"] == torch.__version__ and "git_commit" in record["environment"]
    head = (tmp_path / "gradient_flow.md").read_text().splitlines()[0]
    assert "4 tanh blocks of width 8, batch" in head and "seed 0" in head and "torch " in head and "code " in head
    before = (tmp_path / "gradient_flow.md").read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # the files are not replaced silently
    assert again.returncode == 2 and "gradient_flow.md exists; use --overwrite" in again.stderr
    assert again.stderr.count("\n") == 1 and (tmp_path / "gradient_flow.md").read_bytes() == before
    assert subprocess.run([*cmd, "--overwrite"], capture_output=True, timeout=120).returncode == 0


def test_a_missing_optional_package_is_one_line(capsys, tmp_path, monkeypatch):
    """A pretrained tokenizer whose library is not installed: the error names the extra, no traceback."""
    import builtins

    real_import = builtins.__import__

    def no_tiktoken(name, *args, **kwargs):
        if name == "tiktoken" or name.startswith("tiktoken."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    import base64

    ranks = tmp_path / "tiny.tiktoken"  # tiktoken's ranks format: base64 of a token's bytes, its rank
    ranks.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    for name in [n for n in sys.modules if n == "tiktoken" or n.startswith("tiktoken.")]:
        monkeypatch.delitem(sys.modules, name)  # imported by an earlier test: make the import run again
    monkeypatch.setattr(builtins, "__import__", no_tiktoken)
    code = main(["train", "lm", "--tokenizer", f"tiktoken:gpt2:{ranks}", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("skiplab: error:") and "pip install" in err, err


@pytest.mark.parametrize("argv", [["train", "lm", "--activation-checkpointing"], ["train", "lm", "--amp"],
                                  ["train", "lm", "--compile"], ["train", "lm", "--bias"], ["train", "image", "--amp"]])
def test_a_boolean_option_given_another_word_is_one_line(argv, capsys, tmp_path):
    """A bool field's option (a training option or a model option) takes true/yes/1 or false/no/0, any case; any
    other word is argparse's one line and exit code 2, before anything is written."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main([*argv, "maybe", "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert f"error: argument {argv[-1]}: expected a boolean (true, yes, 1, false, no, 0), got 'maybe'" in err
    assert not out.exists()
    assert [config.boolean(w) for w in ("Yes", "TRUE", "1", "no", "False", "0")] == [True] * 3 + [False] * 3


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "x"])
def test_a_length_penalty_is_a_finite_number_at_least_zero(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["eval", "mt", "--checkpoint", "RUN", "--alpha", value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --alpha: " in err
    assert ("expected a number" if value == "x" else "must be a finite number >= 0") in err
    assert config.at_least(0)("0.6") == 0.6


def test_demo_with_options_is_the_main_job_and_its_help_shows_its_own_defaults(monkeypatch, capsys):
    """`skiplab demo --seeds 1` runs the main job with that option; `demo image --help` shows the demo's sizes, not
    the image task's (Fashion-MNIST, 6 epochs, runs/demo)."""
    import skiplab.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "cmd_compare", lambda args: seen.update(vars(args)))
    assert main(["demo", "--seeds", "1", "--epochs", "2"]) == 0
    assert (seen["task"], seen["seeds"], seen["epochs"], seen["dataset"]) == ("image", (1,), 2, "fashion-mnist")
    with pytest.raises(SystemExit):
        main(["demo", "image", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for said in ("(default: fashion-mnist)", "(default: 6)", "(default: runs/demo)", "(default: 2000)"):
        assert said in shown, said
    assert "(default: cifar10)" not in shown and "(default: 164)" not in shown


def test_every_commands_help_prints(capsys):
    """``--help`` of every command and sub-command, all the way down: argparse %-formats each help text, so a
    stray % (a metric named "error %") was a traceback of ``skiplab compare --help``."""
    def walk(parser, path):
        yield path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])

    paths = list(walk(build_parser(), []))
    assert ["compare", "image"] in paths and ["analyze", "gates"] in paths
    for path in paths:
        with pytest.raises(SystemExit) as stop:
            main([*path, "--help"])
        assert stop.value.code == 0, path
        assert capsys.readouterr().out.startswith("usage: skiplab")
