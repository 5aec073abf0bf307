"""The spec grammar: canonical forms, aliases, and a clear error for every bad spec."""

import pytest

import skiplab
from skiplab.connections import SpecError, parse_spec


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("1xSkip", "1xSkip"),
        ("Residual", "1xSkip"),
        ("PostLN", "1xSkip+LN"),
        ("2.0xSkip", "2xSkip"),
        (".5xSkip+LN", "0.5xSkip+LN"),
        ("0.5xSkip+LN(f=2)", "0.5xSkip+LN(f=2)"),
        ("1xSkip(f=1)", "1xSkip"),
        ("2rSkip+LN", "2rSkip+LN"),
        ("wSkip+LN(init=1)", "wSkip+LN"),
        ("wSkip+LN(init=2)", "wSkip+LN(init=2)"),
        ("SAS+LN", "SAS+LN"),  # a written norm stays written: on an RMS model SAS takes RMS, SAS+LN keeps LN
        ("SAS", "SAS"),
        ("MixLN+LN(alpha=0.25)", "MixLN+LN"),
        ("LNS", "LNS"),
        ("LNS+RMS", "PreRMS(scale=depth)"),
        ("LNS+LN+ValueRes", "PreLN(scale=depth)+ValueRes"),
        ("PreDyT(alpha0=0.5)", "PreDyT"),
        ("PreDyT(alpha0=1.0)", "PreDyT(alpha0=1)"),
        ("MixLN+DyT(alpha0=llm)", "MixLN+DyT(alpha0=llm)"),
        ("SAS( gate = single , gamma=free )", "SAS(gate=single,gamma=free)"),
        ("SAS+BN", "SAS+BN"),
        ("Highway(bias=-2)", "Highway"),
        ("Highway(bias=-1.5)", "Highway(bias=-1.5)"),
    ],
)
def test_canonical_spec(text, canonical):
    conn = skiplab.connection(text, 4)
    assert conn.spec == canonical
    assert parse_spec(canonical) == parse_spec(text)


def test_parsed_fields():
    spec = parse_spec("0.5xSkip+BN(f=2)")
    assert (spec.name, spec.number, spec.norm, spec.options) == ("xSkip", 0.5, "BN", {"f": 2.0})
    assert parse_spec("SAS").options["gate"] == "full" and parse_spec("SAS").norm == "LN"
    assert parse_spec("PreDyT(alpha0=llm)").options == {"scale": "none", "depth_alpha": 0.0, "depth_base": 1.0,
                                                         "alpha0": "llm"}


@pytest.mark.parametrize("text, norm, written", [
    ("MixLN", "LN", False), ("MixLN+LN", "LN", True), ("MixLN+RMS", "RMS", True), ("SAS", "LN", False),
    ("PostLN", "LN", True), ("1xSkip", None, False), ("PreLN", "LN", False), ("PreRMS", "RMS", False),
    ("LNS", "LN", False), ("LNS+RMS", "RMS", False),  # LNS+RMS is PreRMS(scale=depth): its name names RMS
])
def test_the_spec_remembers_whether_its_norm_was_written(text, norm, written):
    spec = parse_spec(text)
    assert (spec.norm, spec.norm_written) == (norm, written)


@pytest.mark.parametrize(
    "bad,problem",
    [
        ("foo", "unknown name 'foo'"),
        ("0rSkip+LN", "integer >= 1, got 0"),
        ("2.5rSkip+LN", "integer >= 1, got 2.5"),
        ("-1xSkip", "λ of xSkip must be a finite number > 0, got -1"),
        ("0xSkip", "> 0, got 0"),
        ("SAS(gate=triple)", "gate: must be one of full, single, transform, got 'triple'"),
        ("2rskip+ln", "did you mean 'rSkip'?"),
        ("rSkip+LN", "needs its leading number"),
        ("2rSkip", "needs a normalisation"),
        ("2SAS", "SAS takes no leading number"),
        ("PreLN+LN", "PreLN takes no normalisation +LN"),
        ("1xSkip+GN", "+GN is neither a normalisation (LN, BN, RMS, DyT) nor a design across the stack"),
        ("2xSkip+LM", "+LM is neither a normalisation"),
        ("HC(n=1.5)", "option n: must be an integer >= 1, got 1.5"),
        ("LAuReL(form=lr,rank=x)", "option rank: must be an integer >= 1, got x"),
        ("ReZero(init=abc)", "option init: must be a number, got abc"),
        ("MixLN(alpha=q)", "option alpha: must be a number, got q"),
        ("SAS(bogus=1)", "SAS has no option 'bogus'"),
        ("MixLN(alpha0=llm)", "alpha0 sets DyT's initial α and MixLN builds no DyT here: write +DyT"),
        ("PreDyT(alpha0=0)", "option alpha0: must be a finite number > 0, got 0"),
        ("LNS+BN", "LNS takes no normalisation +BN (allowed: +LN, +RMS, +DyT)"),
        ("LNS(scale=depth)", "LNS has no option 'scale'"),
        ("1xSkip(f)", "option 'f' is not key=value"),
        ("1xSkip(f=-2)", "option f: must be a finite number > 0"),
        ("1xSkip(f=abc)", "option f:"),
        ("2xSkip+LN(", "not of the form"),
        ("", "not of the form"),
        ("HC(n=4,n=5)", "option n is given twice"),
        ("PostLN(f=2)", "PostLN is short for 1xSkip+LN and takes no options or norm of its own"),
        ("PostLN+RMS", "write the design in full (e.g. 1xSkip+RMS, 1xSkip+LN(f=2))"),
        ("Residual+LN", "Residual is short for 1xSkip and takes no options or norm"),
        # numbers as the grammar writes them, not all that float() and int() read
        ("\uff12xSkip", "not of the form"),  # a full-width 2
        ("SAS(alpha_bias=1_0)", "option alpha_bias: must be a number, got 1_0"),
        ("SAS(alpha_bias=\u0663)", "option alpha_bias: must be a number, got \u0663"),  # an Arabic-Indic 3
        ("HC(n=1_0)", "option n: must be an integer >= 1, got 1_0"),
        ("HC(n=\u0664)", "option n: must be an integer >= 1, got \u0664"),
        ("SAS(alpha_bias=inf)", "option alpha_bias: must be finite, got inf"),
        ("PreLN(,)", "an empty option between commas"),
        ("SAS(gate=single,)", "an empty option between commas"),
        ("SAS(,gate=single)", "an empty option between commas"),
        ("PreLN+ValueRes(lambda=1.5)", "option lambda: must be in [0, 1], got 1.5"),
        ("PreLN+ValueRes(lambda=-1)", "option lambda: must be in [0, 1], got -1"),
    ],
)
def test_bad_spec_names_the_problem_and_lists_known_names_where_the_name_is_the_problem(bad, problem):
    with pytest.raises(ValueError) as err:
        skiplab.connection(bad, 8)
    message = str(err.value)
    assert problem in message
    listed = "Known: 1xSkip, λxSkip" in message and "krSkip+LN" in message and "SAS" in message
    assert listed == (problem.startswith(("unknown name", "did you mean", "not of the form")))  # else: one short line
    assert "\n" not in message and (listed or len(message) < 200)
    assert isinstance(err.value, SpecError)


def test_bad_layout_and_dim():
    with pytest.raises(ValueError, match="unknown layout 'nchw'"):
        skiplab.connection("1xSkip", 8, layout="nchw")
    with pytest.raises(ValueError, match="dim must be a positive integer"):
        skiplab.connection("1xSkip", 0)
    with pytest.raises(ValueError, match="got 2.5"):
        skiplab.connection("1xSkip", 2.5)
    assert skiplab.connection("1xSkip", __import__("numpy").int64(3)).dim == 3
    with pytest.raises(ValueError, match="must be a string"):
        skiplab.connection(2, 8)
    with pytest.raises(TypeError, match="place must be a skiplab.connections.Place .* got str"):
        skiplab.connection("PreLN", 8, place="foo")


@pytest.mark.parametrize("text", ["2r Skip + LN", "2rSkip+LN\t", "\t2rSkip+LN\n", "2rSkip\n+LN"])
def test_whitespace_anywhere_in_a_spec_is_ignored(text):
    """Spaces, tabs and line breaks (a spec read from a file or a shell variable) are all ignored, as the grammar
    says; a tab was refused as "not of the form"."""
    assert skiplab.connection(text, 8).spec == "2rSkip+LN"
