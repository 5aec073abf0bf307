"""``skiplab analyze NAME RUN [--compare RUN ...]``: one analysis of trained runs, written beside each run.

    gradients     per-block gradient norm (skiplab.analysis.gradients)
    gates         SAS α, β, γ; Highway T; wSkip w (skiplab.analysis.learned)
    ratios        the recursive skip's x : F ratio (skiplab.analysis.learned)
    activations   per-block output distributions; h against G(h) (skiplab.analysis.activations)
    linearity     each chosen layer replaced by a trained linear map: metric loss (skiplab.analysis.linearity)
    redundancy    angular distance between layers' hidden states; loss without each block (skiplab.analysis.redundancy)
    norms         hidden-state and sub-layer output RMS per layer, massive activations (skiplab.analysis.norms)
    saturation    DyT layers' share of inputs in tanh's flat range, per kept checkpoint (skiplab.analysis.saturation)

Each run gets ``analysis/<name>.json`` (with the checkpoint read: its step, and the machine and code version that
made it), ``.md`` and ``.png``; with ``--compare`` the first run's
``analysis/<name>_compare.png`` overlays them all. A checkpoint file other than the run's last.pt adds its name:
``RUN/avg5.pt`` writes ``analysis/<name>.avg5.json``, ... Nothing is overwritten without ``overwrite``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from .. import host, run_dir
from . import activations, gradients, learned, linearity, norms, redundancy, saturation
from .report import outputs, pyplot, read_what, write
from .trained import Trained

# name -> (compute(trained, **options), table(result), figure(results))
ANALYSES: dict[str, tuple[Callable[..., dict[str, Any]], Callable, Callable]] = {
    "gradients": (gradients.gradient_norms, gradients.table, gradients.figure),
    "gates": (lambda tr, **kw: learned.learned(tr, "gates", **kw), learned.table, learned.figure),
    "ratios": (lambda tr, **kw: learned.learned(tr, "ratios", **kw), learned.table, learned.figure),
    "activations": (activations.activations, activations.table, activations.figure),
    "linearity": (linearity.linearity, linearity.table, linearity.figure),
    "redundancy": (redundancy.redundancy, redundancy.table, redundancy.figure),
    "norms": (norms.norms, norms.table, norms.figure),
    "saturation": (saturation.saturation, saturation.table, saturation.figure),
}


# the analyses that read a language model's examples as its split's first windows (Trained.examples without
# shuffle), so that --seed changes nothing there; linearity draws its training windows at random
FIRST_WINDOWS = ("gradients", "gates", "ratios", "activations", "redundancy", "norms", "saturation")


def analyze(name: str, trained: list[Trained], overwrite: bool = False, progress: bool = True,
            **options: Any) -> list[dict[str, Any]]:
    """Run analysis ``name`` on every trained run, write its files, print its table; return the results."""
    compute, table, figure = ANALYSES[name]
    kinds = {t.kind for t in trained}
    if len(kinds) > 1:
        raise ValueError(f"cannot overlay runs of different tasks ({', '.join(sorted(kinds))}) in one figure")
    files = [outputs(t.path, name + t.analysis_name, overwrite) for t in trained]  # refuse before any work
    overlay = trained[0].path / "analysis" / f"{name}{trained[0].analysis_name}_compare.png"
    if len(trained) > 1 and overlay.exists() and not overwrite:
        raise run_dir.RunDirError(f"{overlay} exists; use --overwrite to replace it")
    if options.get("seed") and name in FIRST_WINDOWS and any(t.kind == "lm" for t in trained):
        print(f"note: {name} reads a language model's first {options.get('examples', '')} windows of the split, the "
              f"same whatever --seed", file=sys.stderr)
    results = [compute(t, progress=progress, **options) for t in trained]  # every run's, before any file is written
    labels = [r["label"] for r in results]
    read = [t.source.name if t.source is not None else t.path.name for t in trained]
    for t, r, file in zip(trained, results, read):  # checkpoints of one run, or runs of one model, told apart
        if labels.count(r["label"]) > 1:
            r["label"] = f"{r['label']} [{file if read.count(file) == 1 else t.source or t.path}]"
    env = host.environment()
    for t, f, result in zip(trained, files, results):
        fig = figure([result])
        made = {"checkpoint": {"path": str(t.source or t.path), "step": t.checkpoint.get("step"),
                               "epoch": t.checkpoint.get("epoch"),
                               "averaged": t.checkpoint.get("averaged")}, "environment": env}  # what and where from
        write(f, {**result, **made}, table(result), fig)
        pyplot().close(fig)
        print(f"{t.source or t.path} ({result['label']}): {name}, {read_what(result)}, "
              f"{result['mode']} mode\n{table(result)}\nwrote {', '.join(str(p) for p in f.values())}")
    if len(results) > 1:
        fig = figure(results)
        fig.savefig(overlay, dpi=120)
        print(f"wrote {overlay}")
    return results

