"""What the connections of a trained model learned, averaged over the examples of a split.

``gates``: SAS's α = σ(S_α), β = σ(S_β) and γ = (1−α)(1−β) or the free γ (Eqs. 2-4 of the SAS paper),
the Highway transform gate T = σ(x W_T + b_T), wSkip's learned vector w (its norm ‖w‖ and mean; the
rSkip+LN paper reports ‖w‖ = 1.34, mean 0.24 for a middle-layer w ∈ R^32 initialised at 1), the branch
gain α of ReZero and SkipInit (one learned scalar each, the same for every example: std 0) and LayerScale's
λ (its mean and largest magnitude), Admin's shortcut weight ω (its mean and norm), hyper-connections' static
mixing weights (the mean diagonal of A_r and mean of B), LAuReL's α and β (form=rw), ‖B A‖ (form=lr) and γ_j (form=pa), nGPT's
eigen learning rates α (mean, least, largest), and of the designs across a stack's layers the value residual's λ_l
per layer (``+ValueRes``), the U-Net skip weight w_i of the layer it enters (``+UNet``), the speedrun's a_l, b_l and
backout's λ, and the "i reads j" matrices of the designs that mix earlier outputs (:mod:`.mixing`). The learned
parameters need no data.

``ratios``: the recursive skip's x : F ratio (Appendix A of the rSkip+LN paper, the sum to k − 1):

    ratio = 1 + Σ_{i=1}^{k-1} Π_{j<=i} σ_j / Π_{j<=i} w_j

at every position, averaged over features; the paper reports 2.64 for 2rSkip+LN, averaged over the
middle stage's blocks of its trained CIFAR-10 ResNet-110.

Each value is first averaged over what one example holds (images: its channels and positions, one number an
example) or one real target/source position holds (MT and LM: its features; padding left out); the mean and the
std (population) are over those numbers, so the std is the spread across examples or positions, not across the
features within them. The connections record only inside
:func:`skiplab.connections.recording`, so training never pays for this.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm import tqdm

from ..connections import iter_connections, recording
from . import mixing
from .report import Moments, markdown, per_position, pyplot, read_what
from .trained import Trained

KINDS = {"gates": ("SAS", "Highway", "wSkip", "ReZero", "SkipInit", "LayerScale", "Admin", "HC", "LAuReL", "nGPT"),
         "ratios": ("rSkip",)}
GATES = ("alpha", "beta", "gamma", "T")
# what they learned is a parameter, read as it is
DATA_FREE = ("wSkip", "ReZero", "SkipInit", "LayerScale", "Admin", "HC", "LAuReL", "nGPT")
PARAMS = ("w_norm", "w_mean", "lambda_mean", "lambda_abs_max", "omega_mean", "omega_norm", "A_r_diag_mean", "B_mean",
          "ba_norm", "alpha_mean", "alpha_min", "alpha_max", "value_lambda", "skip_weight", "resid_lambda", "resid_lambda_attn", "resid_lambda_cross", "resid_lambda_ffn",
          "x0_lambda", "backout_lambda", "backout_layer")  # data-free values without a spread
PARAM_FAMILIES = ("pa_gamma_",)  # numbered data-free values (LAuReL-PA's γ_j, j = 0, ..., k − 1)
PAPER_RATIO = 2.64  # rSkip+LN paper, Section 4.3: 2rSkip+LN, middle stage of ResNet-110 on CIFAR-10


META = ("connection", "block", "spec", "stage", "dim")  # a row's fields that are not learned values


def learned(tr: Trained, what: str, split: str = "train", examples: int = 10000, seed: int = 0,
            progress: bool = True) -> dict[str, Any]:
    """Per connection of the designs ``what`` covers, the mean and std of what it learned over ``split``."""
    chosen = {n: c for n, c in iter_connections(tr.model) if c.name in KINDS[what]}
    across = _across_rows(tr) if what == "gates" else []
    mixes = mixing.mixing(tr, split, examples, seed, progress) if what == "gates" else []
    if not chosen and not across and not mixes:
        designs = sorted({c.spec for _, c in iter_connections(tr.model)}) or [tr.config["model"]]
        raise ValueError(f"{tr.path}: {', '.join(designs)} has no {what} to analyze "
                         f"({what} are those of {', '.join(KINDS[what]).replace('rSkip', 'krSkip+G')})")
    moments: dict[str, dict[str, Moments]] = {n: {} for n in chosen}
    per_example = True  # each value a row per example (images) or per real position (a mask: MT, LM)
    seen, t0 = 0, time.time()
    if any(c.name not in DATA_FREE for c in chosen.values()):
        tr.model.eval()
        bar = tqdm(total=examples, desc=f"{what} {tr.path.name}", unit="ex", disable=not progress)
        with torch.no_grad(), recording(tr.model) as logs:
            for ex in tr.examples(split, examples, seed):
                tr.forward(ex)
                for name, conn in chosen.items():
                    mask = tr.mask(ex, tr.block_of(name))
                    per_example = per_example and mask is None
                    for entry in logs[name]:
                        for key, value in _values(conn, entry).items():
                            moments[name].setdefault(key, Moments()).add(per_position(value, mask, len(ex)).mean(1))
                for log in logs.values():
                    log.clear()
                seen += len(ex)
                bar.update(len(ex))
        bar.close()
    rows = []
    for name, conn in chosen.items():
        row: dict[str, Any] = {"connection": name, "block": tr.block_of(name), "spec": conn.spec}
        row["stage"] = tr.stage_of(row["block"])
        for key, m in moments[name].items():
            row[key], row[f"{key}_std"] = m.mean, m.std
        if conn.name == "wSkip":
            w = conn.weight.detach()
            row.update(w_norm=w.norm().item(), w_mean=w.mean().item(), w_std=w.std(unbiased=False).item(), dim=w.numel())
        elif conn.name in DATA_FREE:
            for key, value in conn.stats().items():
                if key in GATES and isinstance(value, (int, float)):  # one learned number for every example
                    row[key], row[f"{key}_std"] = value, 0.0
                elif key in PARAMS or key.startswith(PARAM_FAMILIES):
                    row[key] = value
        rows.append(row)
    rows += across
    if mixes and not seen:  # only the mixing matrices read examples
        seen = mixes[0]["examples"]
    result = {"analysis": what, "run": str(tr.path), "label": tr.label, "split": split, "examples": seen,
              "per": "example" if per_example else "position", "mode": "eval", "seed": seed, "connections": rows,
              "time_s": time.time() - t0, "config": tr.config}
    if mixes:
        result["mixing"] = mixes
    if what == "ratios":
        result["stages"] = _by_stage(rows)
        result["network"] = sum(r["ratio"] for r in rows) / len(rows)
        result["paper"] = {"ratio": PAPER_RATIO, "where": "2rSkip+LN, middle stage of ResNet-110, CIFAR-10 "
                                                          "(rSkip+LN paper, Section 4.3)"}
    return result


def _across_rows(tr: Trained) -> list[dict[str, Any]]:
    """A row per layer and quantity of the designs across each stack (held as ``across`` by the module that
    holds the stack's layers)."""
    rows = []
    for prefix, path in tr.stacks.items():
        holder = path.rpartition(".")[0]
        held = getattr(tr.model.get_submodule(holder), "across", None)  # None: a family without such designs
        for design in held.designs if held is not None else ():
            for index, key, value in design.rows():
                block = f"{prefix}.{index}"
                rows.append({"connection": f"{holder + '.' if holder else ''}across.{design.name}", "block": block,
                             "spec": f"+{design.name}", "stage": tr.stage_of(block), key: value})
    return rows


ROW_FIELDS = ("connection", "block", "spec", "stage")


def _across_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The quantities of the designs across a stack that are neither gates nor the known parameters (their
    ``stats()`` keys: the speedrun's a_l and b_l, backout's λ ...), in the order they first appear."""
    keys: dict[str, None] = {}
    for r in rows:
        if ".across." in f".{r['connection']}":
            keys.update({k: None for k in r if k not in ROW_FIELDS and k not in GATES and k not in PARAMS})
    return list(keys)


def _layer(block: str) -> int:
    """The 1-based layer of a block name (``decoder.2`` -> 3)."""
    return int(block.rpartition(".")[2]) + 1


def _values(conn, entry: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The recorded quantities of one forward pass that this analysis averages."""
    if conn.name == "rSkip":
        r = conn.position_ratio(entry["sigma_prods"])
        if r.dim() == 0:  # k = 1: the ratio is 1 everywhere
            return {"ratio": entry["pre"].new_ones(()).expand(*entry["pre"].shape[:-1], 1)
                    if conn.layout == "seq" else entry["pre"].new_ones(entry["pre"].shape[0], 1)}
        return {"ratio": r.mean(-1 if conn.layout == "seq" else 1, keepdim=True)}
    return {k: v for k, v in entry.items() if k in GATES}


def _by_stage(rows: list[dict[str, Any]]) -> dict[str, float]:
    stages: dict[str, list[float]] = {}
    for r in rows:
        stages.setdefault(r["stage"], []).append(r["ratio"])
    return {s: sum(v) / len(v) for s, v in stages.items()}


def table(result: dict[str, Any]) -> str:
    rows = result["connections"]
    if result["analysis"] == "ratios":
        body = [[r["connection"], r["stage"], r["spec"], r["ratio"], r["ratio_std"]] for r in rows]
        text = markdown(["connection", "stage", "spec", "x : F ratio (mean)", "std"], body)
        stages = ", ".join(f"{s} {v:.3f}" for s, v in result["stages"].items())
        return (f"{text}\n\nper stage: {stages}; network: {result['network']:.3f}; "
                f"the paper: {result['paper']['ratio']} ({result['paper']['where']})")
    numbered = {k: None for r in rows for k in r if k.startswith(PARAM_FAMILIES)}
    keys = [k for k in (*GATES, *PARAMS, *numbered, *_across_keys(rows)) if any(k in r for r in rows)]
    # one mechanism across the layers (the value residual's) is one connection name: its rows told apart by block
    where = ["block"] if len({r["connection"] for r in rows}) < len(rows) else []
    head = ["connection", *where, "spec"] + [f"{k} (mean ± std)" if k in GATES else k for k in keys]
    body = [[r["connection"], *(r.get(w, "-") for w in where), r["spec"]]
            + [(f"{r[k]:.4f} ± {r[k + '_std']:.4f}" if k in GATES else r[k]) if k in r else "-" for k in keys]
            for r in rows]
    return markdown(head, body)


def figure(results: list[dict[str, Any]]):
    """Per block: α, β, γ (SAS), T (Highway), ‖w‖ (wSkip), α (ReZero, SkipInit), mean λ (LayerScale) or the x : F ratio, mean ± std, one line per run
    and quantity (Fig. 3 of the SAS paper plots α and β per block this way)."""
    plt = pyplot()
    mixes = results[0].get("mixing", [])
    if mixes:  # the first run's "i reads j" matrices beside the learned values
        fig, axes = plt.subplots(1, 1 + len(mixes), figsize=(8 + 5 * len(mixes), 4.5), squeeze=False)
        ax = axes[0][0]
        mixing.draw(axes[0][1:], mixes)
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5))
    what = results[0]["analysis"]
    for i, r in enumerate(results):
        rows = r["connections"]
        keys = ["ratio"] if what == "ratios" else [k for k in (*GATES, "w_norm", "lambda_mean") if any(k in x for x in rows)]
        if what == "gates":  # any other learned number of a connection (nGPT's α, LAuReL's ‖BA‖, ...)
            own = [x for x in rows if ".across." not in f".{x['connection']}"]
            keys += sorted({k for x in own for k, v in x.items() if k not in keys and k not in META
                            and not k.endswith("_std") and isinstance(v, (int, float)) and not isinstance(v, bool)})
        for j, key in enumerate(keys):
            xs = [n for n, x in enumerate(rows, 1) if key in x]
            ys = [x[key] for x in rows if key in x]
            sd = [x.get(f"{key}_std", 0.0) for x in rows if key in x]
            label = key if len(results) == 1 else f"{r['label']}: {key}"
            line = ax.plot(xs, ys, marker="o", ms=3, label=label, color=f"C{i * len(keys) + j}")[0]
            ax.fill_between(xs, [a - b for a, b in zip(ys, sd)], [a + b for a, b in zip(ys, sd)],
                            color=line.get_color(), alpha=0.15)
        across = [x for x in rows if ".across." in f".{x['connection']}"]
        for j, key in enumerate(["value_lambda", "skip_weight", *_across_keys(rows)] if what == "gates" else []):
            points = sorted((_layer(x["block"]), x[key]) for x in across if key in x)
            if points:  # learned scalars of the designs across the stack, against the layer they belong to
                label = f"{key} (by layer)" if len(results) == 1 else f"{r['label']}: {key} (by layer)"
                ax.plot(*zip(*points), marker="s", ms=3, ls="--", label=label, color=f"C{(i + 3 + j) % 10}")
    if what == "ratios":
        ax.axhline(PAPER_RATIO, ls="--", color="grey", lw=1, label=f"paper: {PAPER_RATIO} (2rSkip+LN, ResNet-110)")
    ax.set_xlabel("connection (input side first); layer, for the designs across a stack")
    first = results[0]
    over = f"mean ± std over {first.get('per', 'example')}s"
    ax.set_ylabel(f"x : F ratio ({over})" if what == "ratios" else f"learned value ({over})")
    ax.set_title(f"{what}, {read_what(first)}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
