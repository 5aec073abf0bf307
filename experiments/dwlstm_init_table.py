"""The table of experiments/dwlstm_init.sh: its runs beside the recorded 003 Table 1 runs at cpu scale.

Each row: tokenised BLEU of test2016 (the average of the last 5 checkpoints, beam 4) mean ± std over the seeds found,
per seed, detokenised BLEU and chrF, the validation loss at the last update, the paired bootstrap p (1,000
resamples, tokenised BLEU) of each seed against the same seed of the pre-norm Transformer of 003 Table 1, and the
tokenised BLEU of the last checkpoint alone where it was scored (score.test.beam4.last.json; the recorded runs of
003 Table 1 kept no checkpoints, so theirs is not known).
Usage: python experiments/dwlstm_init_table.py OUT [RECORDED]   (RECORDED: docs/results/repro/cpu/runs)
Writes OUT/table.md and OUT/table.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from skiplab.translate.metrics import paired_bootstrap
from skiplab.translate.translator import split_forms

SCORE = "score.test.beam4.avg5.json"
LAST = "score.test.beam4.last.json"
# the recorded runs of 003 Table 1 at cpu scale (docs/reproducing.md), by their run directories
RECORDED_ROWS = [
    ("transformer-small(connection=PreLN), xavier, inverse_sqrt 5e-4 (003 Table 1)",
     "multi30k_transformer-small_connection=PreLN_-8b95dd61"),
    ("dwlstm-small, lipschitz, inverse_sqrt 5e-4 (003 Table 1)", "multi30k_dwlstm-small-a1e6bc86"),
    ("dwlstm-small(init=xavier), inverse_sqrt 5e-4 (003 Table 1, Xavier)", "multi30k_dwlstm-small-1ad37855"),
]
NEW_ROWS = [
    ("transformer-small(connection=PreLN,init=lipschitz), inverse_sqrt 5e-4 (control)", "control"),
    ("dwlstm-small, lipschitz, vaswani (peak 2.2e-3)", "vaswani"),
    ("transformer-small(connection=PreLN), xavier, vaswani (peak 2.2e-3)", "xvaswani"),
]


def seeds(run: Path) -> dict[int, Path]:
    return {int(p.name[4:]): p for p in sorted(run.glob("seed*")) if (p / SCORE).is_file()}


def hyps(seed_dir: Path, score: dict) -> list[str]:
    path = Path(score["hypotheses"])
    path = path if path.is_file() else seed_dir / path.name
    return path.read_text().splitlines()


def main(out: Path, recorded: Path) -> None:
    baseline = seeds(recorded / RECORDED_ROWS[0][1])
    rows = []
    for label, run in [(lbl, recorded / d) for lbl, d in RECORDED_ROWS] + [(lbl, out / d) for lbl, d in NEW_ROWS]:
        found = seeds(run)
        if not found:
            continue
        per_seed = []
        for seed, d in found.items():
            score = json.loads((d / SCORE).read_text())
            config = json.loads((d / "config.json").read_text())
            last = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])
            p = None
            if seed in baseline and run != recorded / RECORDED_ROWS[0][1]:
                base = baseline[seed]
                base_score = json.loads((base / SCORE).read_text())
                forms = split_forms(config["config"], "test", hyps(d, score))
                base_forms = split_forms(json.loads((base / "config.json").read_text())["config"], "test",
                                         hyps(base, base_score))
                p = paired_bootstrap(forms.tok_refs, base_forms.tok_hyps, forms.tok_hyps, metric="bleu_tok")["p_value"]
            last_score = json.loads((d / LAST).read_text()) if (d / LAST).is_file() else None
            per_seed.append({"seed": seed, "bleu_tok": score["bleu_tok"], "bleu": score["bleu"], "chrf": score["chrf"],
                             "last_bleu_tok": last_score["bleu_tok"] if last_score else None,
                             "valid_loss": last["valid_loss"], "step": last["step"], "p_vs_preln": p,
                             "schedule": config.get("schedule"), "init": config["model"].get("init")})
        values = [s["bleu_tok"] for s in per_seed]
        rows.append({"row": label, "run": str(run), "mean": statistics.mean(values),
                     "std": statistics.stdev(values) if len(values) > 1 else None, "seeds": per_seed})
    lines = ["| run | tokenised BLEU, mean ± std (seeds) | per seed | detok. BLEU | chrF | valid loss | p vs PreLN "
             "| last checkpoint alone |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["seeds"]
        std = f" ± {r['std']:.2f}" if r["std"] is not None else ""
        join = lambda key, fmt: " / ".join(fmt.format(x[key]) for x in s)  # noqa: E731
        ps = " / ".join("-" if x["p_vs_preln"] is None else ("<0.001" if x["p_vs_preln"] < 0.001
                                                               else f"{x['p_vs_preln']:.3f}") for x in s)
        lines.append(f"| {r['row']} | {r['mean']:.2f}{std} ({len(s)}) | {join('bleu_tok', '{:.2f}')} | "
                     f"{join('bleu', '{:.2f}')} | {join('chrf', '{:.1f}')} | {join('valid_loss', '{:.2f}')} | {ps} | "
                     + (" / ".join("-" if x["last_bleu_tok"] is None else f"{x['last_bleu_tok']:.2f}" for x in s)) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "docs/results/repro/cpu/runs"))
