"""The options of ``skiplab analyze NAME``: each analysis declares its own, and the command line is built from
them (:func:`add_parsers`); :func:`given` reads back the ones a command gave, as :func:`~skiplab.analysis.analyze.
analyze` takes them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import count, parse_list

# An option: (flags, argparse keywords). The keyword ``dest`` is the analysis function's argument.
Option = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class AnalysisOptions:
    """One analysis on the command line: its help, its examples' default split and count ('' and 0: it takes no
    examples), and options of its own."""

    help: str
    split: str = ""
    examples: int = 0
    own: tuple[Option, ...] = field(default=())


ANALYSIS_OPTIONS: dict[str, AnalysisOptions] = {
    "gradients": AnalysisOptions(
        "per-block gradient norm ‖∂L_n/∂y_n‖ over random examples (Fig. 3 of the rSkip+LN paper)", "train", 10000,
        (("--mode", dict(default="eval", choices=("eval", "train"),
                         help="the model's mode: eval (examples independent) or train (batch statistics, dropout) "
                              "(default: eval)")),)),
    "gates": AnalysisOptions("SAS α, β, γ, Highway T and wSkip w per block, over a split (Fig. 3 of the SAS paper)",
                             "train", 10000),
    "ratios": AnalysisOptions("the recursive skip's learned x : F ratio per block (Appendix A of the rSkip+LN paper)",
                              "train", 10000),
    "activations": AnalysisOptions(
        "per-block output distributions, and the sum h against G(h) (the tutorial)", "test", 2000,
        (("--near-zero", dict(type=float, default=0.01, help="|y| below this is near zero (default: 0.01)")),
         ("--large", dict(type=float, default=5.0, help="|y| above this is large (default: 5)")))),
    "linearity": AnalysisOptions(
        "each chosen layer replaced by a linear map trained in its place: the metric lost (Section 4 of the "
        "depth-wise LSTM paper)", "", 0,
        (("--layers", dict(type=parse_list, required=True, metavar="LAYERS",
                           help="layers to replace, one at a time, comma-separated: block.3 (image), encoder.0, "
                                "decoder.2 (MT)")),
         ("--steps", dict(type=count(1), default=100,
                          help="updates of W_d, b_d after the least-squares start (default: 100)")),
         ("--objective", dict(default="task", choices=("task", "regress"),
                              help="train W_d on the task loss or on the layer's own output (default: task)")),
         ("--sample", dict(type=count(1), default=20000,
                           help="positions for the least-squares start (default: 20000)")),
         ("--lr", dict(type=float, default=1e-3, help="Adam learning rate for W_d, b_d (default: 1e-3)")),
         ("--beam", dict(type=count(1), default=4, help="beam size of the BLEU evaluation (default: 4)")),
         ("--score-start", dict(action="store_true",
                                help="also score the model at the least-squares start, before the updates")))),
    "redundancy": AnalysisOptions(
        "angular distance between the hidden states entering layers l and l+k, and the loss without each layer "
        "(the Mix-LN and curse-of-depth papers)", "test", 200,
        (("--k", dict(type=count(1), default=1, help="the span of the distance curve: d(h_l, h_l+k) (default: 1)")),)),
    "norms": AnalysisOptions(
        "hidden-state RMS entering each layer, sub-layer output RMS, massive activations (|h| > ratio x median)",
        "test", 200,
        (("--ratio", dict(type=float, default=100.0,
                          help="an entry is massive above this times its state's median |h| (default: 100)")),)),
    "saturation": AnalysisOptions(
        "DyT layers: the share of their inputs in tanh's flat range (|αx| > threshold) and the mean gain "
        "tanh'(αx), at every checkpoint the run kept (why a DyT model stalls)", "test", 200,
        (("--threshold", dict(type=float, default=2.0,
                              help="an entry is saturated where |αx| is above this (default: 2, where tanh' = 0.07)")),)),
}


def add_parsers(sub: argparse._SubParsersAction, func: Callable[[argparse.Namespace], None]) -> None:
    """One parser per analysis under ``sub``: the run(s), the examples where it takes them, its own options."""
    for name, a in ANALYSIS_OPTIONS.items():
        p = sub.add_parser(name, help=a.help, description=a.help)
        p.add_argument("run", metavar="RUN", help="a run directory (its last.pt) or a checkpoint file")
        p.add_argument("--compare", nargs="+", default=[], metavar="RUN", help="more runs, overlaid in one figure")
        if a.split:
            p.add_argument("--split", default=a.split, help=f"which split's examples (default: {a.split})")
            p.add_argument("--examples", type=count(1), default=a.examples,
                           help=f"random examples (sentences for MT; for a language model the split's first "
                                f"windows of its context) of the split (default: {a.examples})")
        p.add_argument("--seed", type=int, default=0, help="seed of the random choice of examples (default: 0; a "
                       "language model's windows are the split's first whatever the seed)")
        for flags, kwargs in a.own:
            p.add_argument(flags, **kwargs)
        p.add_argument("--overwrite", action="store_true", help="replace the analysis files if they exist")
        p.set_defaults(func=func)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The analysis options of a parsed ``skiplab analyze`` command, as keyword arguments of its analysis."""
    a = ANALYSIS_OPTIONS[args.analysis]
    names = ["seed", *(["split", "examples"] if a.split else []),
             *(flags.lstrip("-").replace("-", "_") for flags, _ in a.own)]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
