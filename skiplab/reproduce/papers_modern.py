"""The headline tables of two more residual/normalisation papers, as :class:`Table` data.

- ``deepnet-table1``: "DeepNet: Scaling Transformers to 1,000 Layers" (Wang et al. 2022; arXiv 2203.00555v1),
  Table 1: BLEU on the WMT-17 En-De test set of base-size encoder-decoder Transformers of 6-6, 18-18, 50-50 and
  100-100 layers, every design of the paper's comparison; "diverged" where the paper prints it (no number: a
  None cell whose note says so). Read from images of the paper's Table 1 and its Table 5 (the base setting's
  hyper-parameters): lr 1.5e-3 for Pre-LN, Post-LN and DeepNorm and 5e-4 for the designs without LN, inverse
  square root with 4,000 warm-up updates from 1e-7, 128 x 4,096 tokens a batch, Adam (0.9, 0.98), ε 1e-8, label
  smoothing 0.1, 100K updates, no clipping, dropout 0.4, weight decay 1e-4; hidden 512, FFN 2,048, 8 heads; mixed
  precision except ReZero.
- ``peri-table1``: "Peri-LN: Revisiting Normalization Layer in the Transformer Architecture" (Kim et al., ICML
  2025; arXiv 2502.02732), its comparison of Post-LN, Pre-LN and Peri-LN at 400M, 1.5B and 3.2B parameters
  pre-trained on 30B tokens of DCLM-baseline (cl100k_base tokens). **The paper's numbers are not transcribed**: the
  table could not be read from this project's machines (the paper's text was reachable only up to its
  introduction); summaries of it quote average benchmark scores (Pre-LN 49.69 / 53.71 / 56.69, Peri-LN 51.57 /
  56.55 / 58.56) that were not checked against the paper, so they are not entered. Its cells at cpu scale are runs
  of skiplab's LLaMA miniature, shared with ``mixln-table1`` and ``lns-table1``.
"""

from __future__ import annotations

from .tables import Cell, Run, Table

DEEPNET = "arXiv:2203.00555v1 (Wang et al. 2022, \"DeepNet: Scaling Transformers to 1,000 Layers\"), Table 1"
_DEPTHS = {"6L-6L": 6, "18L-18L": 18, "50L-50L": 50, "100L-100L": 100}
_DIVERGED = "diverged in the paper (it prints no BLEU)"
_NO_DESIGN = "skiplab has no {} (another system's row)"
_DEEPNET_SETTING = "wmt17-deepnet"
DROPOUT = (("dropout", 0.4),)


def _deepnet_row(row: str, spec: str | None, values: tuple[float | None, ...], missing: str = "") -> tuple[Cell, ...]:
    """One row of DeepNet's Table 1: a design skiplab builds (``spec``) or another system's row (``missing``)."""
    cells = []
    for (column, layers), paper in zip(_DEPTHS.items(), values):
        note = _DIVERGED if paper is None else ""
        if spec is None:
            cells.append(Cell(row, column, paper, None, missing + (f"; {note}" if note else "")))
        else:
            cells.append(Cell(row, column, paper, Run(_DEEPNET_SETTING, connection=spec, layers=layers,
                                                      options=DROPOUT), note))
    return tuple(cells)


DEEPNET_TABLE1 = Table(
    "deepnet-table1", DEEPNET, "WMT-17 En-De, base-size Transformers of 6-6 to 100-100 layers (BLEU; the paper's "
    "None: diverged)", "BLEU", True, baseline="Vanilla Post-LN",
    cells=(_deepnet_row("Vanilla Post-LN", "PostLN", (28.1, None, None, None))
           + _deepnet_row("DS-Init", None, (27.9, None, None, None), _NO_DESIGN.format("depth-scaled initialisation"))
           + _deepnet_row("Admin", "Admin", (27.9, 28.8, None, None))
           + _deepnet_row("ReZero", "ReZero", (26.9, None, None, None))
           + _deepnet_row("R-Fixup", None, (27.5, 28.4, 27.7, None), _NO_DESIGN.format("Fixup"))
           + _deepnet_row("T-Fixup", None, (27.5, 28.4, 27.9, None), _NO_DESIGN.format("T-Fixup"))
           + _deepnet_row("Vanilla Pre-LN", "PreLN", (27.0, 28.1, 28.0, 27.4))
           + _deepnet_row("DLCL", None, (27.4, 28.2, None, 27.5), _NO_DESIGN.format("DLCL (dynamic linear "
                                                                                   "combination of layers)"))
           + _deepnet_row("NormFormer", None, (27.0, 28.3, 27.8, None), _NO_DESIGN.format("NormFormer"))
           + _deepnet_row("DeepNet", "DeepNorm", (27.8, 28.8, 29.0, 28.9))),
    average=0,
    out_of_reach=(("cpu", "its depths run to 100-100 layers (200 Transformer layers a run): tens of hours of "
                          "training on a 2-core CPU (the estimate above), not the scale's hour a table"),),
    reading=("Every skiplab row is its encoder-decoder Transformer at the setting's size with the row's connection on "
             "every sub-layer, dropout 0.4 as the paper's base setting; DeepNet is DeepNorm (α, β of the "
             "encoder-decoder: encoder 0.81(N⁴M)^(1/16) and 0.87(N⁴M)^(−1/16), decoder (3M)^(1/4) and (12M)^(−1/4)). "
             "A None paper cell is a run the paper reports as diverged: ours finishing there is the claim's "
             "opposite, ours diverging agrees."),
    notes=("skiplab has no WMT-17 loader: at paper scale the runs read WMT-14 En-De (the Stanford NMT group's "
           "files; newstest2014 is the test set both years' common recipes use); BLEU is on that test set.",
           "The paper trains the designs without LN at lr 5e-4 and the others at 1.5e-3; a setting here has one lr "
           "(1.5e-3), so ReZero's row runs at it.",
           "The paper's training is mixed precision except ReZero's; skiplab's is bf16 autocast on CUDA for every "
           "row."))

PERI = "arXiv:2502.02732 (Kim et al., ICML 2025, \"Peri-LN\"), the Post-LN / Pre-LN / Peri-LN comparison by size"
_PERI_SETTINGS = {"400M": "dclm-peri400m", "1.5B": "dclm-peri1.5b", "3.2B": "dclm-peri3.2b"}
_NOT_READ = "the paper's number could not be read here (module docstring)"
PERI_TABLE1 = Table(
    "peri-table1", PERI, "Post-LN, Pre-LN and Peri-LN at 400M, 1.5B and 3.2B parameters, 30B tokens of DCLM-baseline "
    "(pre-training loss; the paper's numbers not transcribed)", "loss", False, baseline="Pre-LN",
    cells=tuple(Cell(row, column, None, Run(setting, connection=spec), _NOT_READ)
                for row, spec in (("Post-LN", "1xSkip+RMS"), ("Pre-LN", "PreRMS"), ("Peri-LN", "PeriLN+RMS"))
                for column, setting in _PERI_SETTINGS.items()),
    reading=("Every row is skiplab's LLaMA miniature (RMSNorm, SwiGLU, rotary) with the row's design: Post-LN "
             "1xSkip+RMS, Pre-LN PreRMS, Peri-LN PeriLN+RMS (y = x + Norm(F(Norm(x))), the embeddings normalised, a "
             "final norm). Ours is the final model's test bits per byte at cpu scale; compare orderings and signs."),
    notes=("The Post-LN and Pre-LN cells share their runs with mixln-table1's and lns-table1's rows of the same "
           "depth at cpu scale.",
           "No paper-scale setting: the paper's model shapes and recipe per size were not read here."))

MODERN_TABLES = (DEEPNET_TABLE1, PERI_TABLE1)
