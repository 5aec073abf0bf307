"""The small-scale language-model tables of three 2024-2025 papers, as :class:`Table` data.

- ``mixln-table1``: "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and Post-LN" (Li, Yin,
  Liu, ICLR 2025; arXiv 2412.13795v1), Table 1;
- ``lns-table1`` and ``lns-table4``: "The Curse of Depth in Large Language Models" (Sun et al. 2025; arXiv
  2502.05795), Tables 1 and 4;
- ``hc-table1`` and ``hc-table2``: "Hyper-Connections" (Zhu et al., ICLR 2025; arXiv 2409.19606), Tables 1 and 2,
  OLMo-1B on the dolma v1.5 sample, read from the ICLR camera-ready's text (Table 7 of its appendix gives OLMo-1B
  1.17676442B parameters, which the ``olmo-1b`` preset matches without its LayerNorm gains and biases).

The first two papers train LLaMA (RMSNorm, SwiGLU, rotary positions) on C4 with the T5 tokenizer and report C4
validation perplexity, so every row's design is the RMSNorm form of skiplab's: Post-LN ``1xSkip+RMS``, DeepNorm
``DeepNorm+RMS``, Pre-LN ``PreRMS``, Mix-LN ``MixLN+RMS(alpha=0.25)``, LayerNorm Scaling ``PreRMS(scale=depth)``.
Each paper's numbers are transcribed as it prints them: the curse-of-depth paper re-reports Mix-LN's 130M and
250M rows with two differences (Pre-LN at 130M: 26.73 against Mix-LN's 26.78; Post-LN at 250M: 1409.79 against
1409.09).

Where the numbers were read: Mix-LN Table 1 from a mechanical copy of its arXiv v1 HTML table (the
ai-paper-reviewer page of 2412.13795, which converts arXiv's LaTeXML tables; its Table 7 settings from the same
copy), six of whose 130M and 250M numbers the curse-of-depth paper re-reports; curse-of-depth Table 1 from a copy
of its arXiv v1 HTML table in LaTeXML's markup (``S5.T1``) and the authors' repository image of it
(lmsdss/LayerNorm-Scaling ``images/results.png``), which agree; its Table 4 from the authors' repository image
of the revised paper's table (``images/Caveat.png``), four of whose seven rows are in v1's Table 4 with the
same numbers.
"""

from __future__ import annotations

from .tables import Cell, Run, Table

MIXLN = "arXiv:2412.13795v1 (Li, Yin, Liu, ICLR 2025), Table 1"
LNS1 = "arXiv:2502.05795v1 (Sun et al. 2025), Table 1"
LNS4 = "arXiv:2502.05795 (Sun et al. 2025, the revised version), Table 4"

POST, DEEP, PRE, MIX, LNS = "1xSkip+RMS", "DeepNorm+RMS", "PreRMS", "MixLN+RMS(alpha=0.25)", "PreRMS(scale=depth)"
SCALED_INIT = (("init", "gpt2"),)
SIZES = {"LLaMA-71M": "c4-llama71m", "LLaMA-130M": "c4-llama130m", "LLaMA-250M": "c4-llama250m",
         "LLaMA-350M": "c4-llama350m", "LLaMA-1B": "c4-llama1b"}


def _grid(columns: tuple[str, ...], rows: list[tuple[str, str, tuple[float, ...]]],
          options: dict[str, tuple[tuple[str, str], ...]] | None = None) -> tuple[Cell, ...]:
    """Cells of rows that differ by connection (and model options): (row, spec, one number per column)."""
    options = options or {}
    return tuple(Cell(row, col, paper, Run(SIZES[col], connection=spec, options=options.get(row, ())))
                 for row, spec, values in rows for col, paper in zip(columns, values))


_READING = (
    "Every row is a LLaMA of the paper's shape with the RMSNorm form of the design; our number is the final "
    "model's test bits per byte at smoke and cpu scale (not the paper's unit), so compare the orderings and the "
    "signs of the differences, not the values; at paper scale it is the paper's unit, perplexity per T5 token on C4 "
    "validation, of runs on C4 en prepared once with T5's spiece.model (skiplab prepare lm, DATA_ROOT/c4-t5). "
    "The papers' data loader pads each C4 document to 256 tokens "
    "(GaLore's), skiplab packs documents into windows; the papers' perplexity is exp of the mean per-batch loss "
    "on about 10M validation tokens.")
_DEEPNORM = ("DeepNorm is DeepNet's rule (α and β from the depth); the papers' code (NORM_TYPE=deeppost) fixes "
             "α = 2√2 and draws v, o and the MLP's weights with xavier_normal gain (8L)^(1/4).")
_FINAL_NORM = ("The papers' code ends every variant with an RMSNorm; skiplab's post-norm stacks (Post-LN, DeepNorm) "
               "end with the last layer's own norm and add none.")

MIXLN_TABLE1 = Table(
    "mixln-table1", MIXLN, "C4, LLaMA-71M to 1B: Post-LN, DeepNorm, Pre-LN and Mix-LN (validation perplexity)",
    "perplexity", False, baseline="Pre-LN",
    cells=_grid(("LLaMA-71M", "LLaMA-130M", "LLaMA-250M", "LLaMA-1B"), [
        ("Post-LN", POST, (35.18, 26.95, 1409.09, 1411.54)),
        ("DeepNorm", DEEP, (34.87, 27.17, 22.77, 1410.94)),
        ("Pre-LN", PRE, (34.77, 26.78, 21.92, 18.65)),
        ("Mix-LN", MIX, (33.12, 26.07, 21.39, 18.18))]),
    reading=_READING,
    notes=(_DEEPNORM, _FINAL_NORM,
           "Mix-LN is post-norm in the first ⌊0.25 L⌋ layers, pre-norm after (the paper's α = 25% for these sizes, "
           "Table 7).",
           "Training tokens as the paper prints them: 1.1B, 2.2B, 3.9B, 5B (its Table 7: 10K, 20K, 40K, 100K "
           "updates of 512 sequences of 256 tokens)."))

LNS_TABLE1 = Table(
    "lns-table1", LNS1, "C4, LLaMA-130M to 1B: normalisation layers against LayerNorm Scaling (validation perplexity)",
    "perplexity", False, baseline="Pre-LN",
    cells=_grid(("LLaMA-130M", "LLaMA-250M", "LLaMA-350M", "LLaMA-1B"), [
        ("Post-LN", POST, (26.95, 1409.79, 1368.33, 1390.75)),
        ("DeepNorm", DEEP, (27.17, 22.77, 1362.59, 1409.08)),
        ("Mix-LN", MIX, (26.07, 21.39, 1363.21, 1414.78)),
        ("Pre-LN", PRE, (26.73, 21.92, 19.58, 17.02)),
        ("Pre-LN + LayerNorm Scaling", LNS, (25.76, 20.35, 18.20, 15.71))]),
    reading=_READING + " LayerNorm Scaling is PreRMS(scale=depth): y = x + F(RMSNorm(x)/√l), l the layer (1-based).",
    notes=(_DEEPNORM, _FINAL_NORM,
           "The paper re-reports Mix-LN's 130M and 250M rows; they are transcribed as this paper prints them "
           "(Pre-LN 26.73 at 130M and Post-LN 1409.79 at 250M, where Mix-LN's Table 1 has 26.78 and 1409.09).",
           "Training tokens as the paper prints them: 2.2B, 3.9B, 6.0B, 8.9B."))

_NO_SKIPINIT = ("skiplab's SkipInit is the normalisation-free x + α·F(x) (De & Smith 2020); the row adds the gain to "
                "Pre-LN, x + α·F(LN(x)), which no skiplab spec builds")
_NO_DEPTH_INIT = "skiplab's GPT has no depth-scaled initialisation (its init: default or gpt2)"
LNS_TABLE4 = Table(
    "lns-table4", LNS4, "C4, LLaMA-130M and 250M: LayerNorm Scaling against other scaling methods (perplexity)",
    "perplexity", False, baseline="Pre-LN",
    cells=_grid(("LLaMA-130M", "LLaMA-250M"), [
        ("Pre-LN", PRE, (26.73, 21.92)),
        ("+ LayerScale", "LayerScale+RMS(init=depth)", (27.93, 23.45))])
    + (Cell("+ SkipInit", "LLaMA-130M", 27.41, None, _NO_SKIPINIT),
       Cell("+ SkipInit", "LLaMA-250M", 22.29, None, _NO_SKIPINIT),
       Cell("+ Depth-Scaled Initialization", "LLaMA-130M", 26.95, None, _NO_DEPTH_INIT),
       Cell("+ Depth-Scaled Initialization", "LLaMA-250M", 21.50, None, _NO_DEPTH_INIT))
    + _grid(("LLaMA-130M", "LLaMA-250M"), [
        ("+ Scaled Initialization", PRE, (26.04, 20.98)),
        ("+ LayerNorm Scaling", LNS, (25.76, 20.35)),
        ("+ LayerNorm Scaling + Scaled Initialization", LNS, (25.80, 20.79))],
        options={"+ Scaled Initialization": SCALED_INIT, "+ LayerNorm Scaling + Scaled Initialization": SCALED_INIT}),
    reading=_READING + (
        " Scaled Initialization is read as the authors' code draws it: the output projections of attention and "
        "MLP from N(0, (0.02/√(2L))²), the rest from N(0, 0.02²) (skiplab's init=gpt2). LayerScale starts λ at "
        "CaiT's value for the depth (0.1 up to 18 layers, 1e-5 at 24)."),
    notes=("Pre-LN and + LayerNorm Scaling are the runs of lns-table1's Pre-LN and Pre-LN + LayerNorm Scaling rows.",))

# ---- hyper-connections ------------------------------------------------------------------------------------
HC = "arXiv:2409.19606 (Zhu et al., \"Hyper-Connections\", ICLR 2025), Table {}"
OLMO = "dolma-olmo1b"
_LOSSES = ("V2 eval loss", "V3 eval loss")


def _olmo(rows: list[tuple[str, str, tuple[float, float]]]) -> tuple[Cell, ...]:
    """Cells of OLMo-1B rows: (row, spec, (V2 loss, V3 loss)); both columns are the same runs of ours."""
    return tuple(Cell(row, col, paper, Run(OLMO, connection=spec))
                 for row, spec, values in rows for col, paper in zip(_LOSSES, values))


_HC_READING = (
    "Every row is OLMo-1B's shape (16 layers, SwiGLU, rotary, tied output) with the row's residual connection: the "
    "baseline is Pre-LN, DHC×n is HC(n=N) (dynamic, tanh), W/O tanh HC(n=N,tanh=no), SHC×n HC(n=N,kind=static). "
    "The paper reports OLMo's losses (nats per token of its tokenizer) averaged over the V2 and V3 validation sets; "
    "ours is the final model's test score on one held-out split, the same runs in both columns: bits per byte at "
    "smoke and cpu scale; at paper scale perplexity per OLMo token (exp of the loss) on held-out documents of the "
    "dolma v1.5 sample prepared once with OLMo's tokenizer (skiplab prepare lm, DATA_ROOT/dolma-olmo), as skiplab "
    "has no loader for the V2 and V3 sets. Compare the orderings and the signs of the differences, not the values.")
_HC_NOTES = (
    "The paper's OLMo LayerNorm has no gain or bias (OLMo's layer_norm_with_affine: false; the paper's Appendix B "
    "counts |θ_norm| = 0); skiplab's LN has both, starting at 1 and 0.",
    "Two implementation details of the paper's Section 4 that skiplab's HC does not follow, so that every design "
    "trains on the same weights and optimiser groups: the output projections' initial std scaled by √n, and weight "
    "decay on the dynamic weights only (skiplab's LM recipe decays matrices, A_r and W_r among them, and not vectors).",
    "The paper's PPL columns (per-set perplexities averaged, not exp of the mean loss) and its downstream average are "
    "not transcribed: the first follows the same runs, the second needs OLMo's evaluation suite.",
    "Trained on 500B tokens of the dolma v1.5 sample, one run per row.")
HC_TABLE1 = Table(
    "hc-table1", HC.format(1), "OLMo-1B, 500B tokens: dynamic hyper-connections by expansion rate, with and without tanh "
    "(validation loss)", "loss", False, baseline="OLMo-1B",
    cells=_olmo([
        ("OLMo-1B", "PreLN", (2.811, 2.544)),
        ("DHC×1 W/O tanh", "HC(n=1,tanh=no)", (2.822, 2.556)),
        ("DHC×2 W/O tanh", "HC(n=2,tanh=no)", (2.792, 2.537)),
        ("DHC×4 W/O tanh", "HC(n=4,tanh=no)", (2.779, 2.516)),
        ("DHC×8 W/O tanh", "HC(n=8,tanh=no)", (2.777, 2.514)),
        ("DHC×1", "HC(n=1)", (2.819, 2.556)),
        ("DHC×2", "HC(n=2)", (2.802, 2.534)),
        ("DHC×4", "HC(n=4)", (2.781, 2.514)),
        ("DHC×8", "HC(n=8)", (2.778, 2.516))]),
    reading=_HC_READING, notes=_HC_NOTES)
HC_TABLE2 = Table(
    "hc-table2", HC.format(2), "OLMo-1B, 500B tokens: static against dynamic hyper-connections (validation loss)",
    "loss", False, baseline="OLMo-1B",
    cells=_olmo([
        ("OLMo-1B", "PreLN", (2.811, 2.544)),
        ("SHC×2", "HC(n=2,kind=static)", (2.799, 2.538)),
        ("DHC×2", "HC(n=2)", (2.802, 2.534)),
        ("DHC×2 W/O tanh", "HC(n=2,tanh=no)", (2.792, 2.529)),
        ("SHC×4", "HC(n=4,kind=static)", (2.791, 2.528)),
        ("DHC×4", "HC(n=4)", (2.781, 2.515)),
        ("DHC×4 W/O tanh", "HC(n=4,tanh=no)", (2.779, 2.516))]),
    reading=_HC_READING,
    notes=(*_HC_NOTES,
           "Transcribed as this table prints them: its V3 losses of DHC×2 W/O tanh (2.529) and DHC×4 (2.515) differ "
           "from Table 1's (2.537 and 2.514) for the same runs; the other shared numbers agree. The rows with DHC "
           "share their runs with hc-table1's."))

LM_TABLES = (MIXLN_TABLE1, LNS_TABLE1, LNS_TABLE4, HC_TABLE1, HC_TABLE2)
