"""The blocked comparison's statistics against hand computation and scipy, and its table's warnings."""

import csv
import io
import math

import pytest
from scipy import stats

from skiplab.analysis.blocks import (RunRecord, holm, holm_once, markdown, mean_difference, one_kind, paired_p, status,
                                     summarise, to_csv, wilcoxon_p)


def test_confidence_interval_of_a_difference_by_hand():
    # d = 1, 2, 3: mean 2, s_d = 1, t_{2, 0.975} = 4.302653, half width 4.302653 / sqrt(3) = 2.484138
    mean, lo, hi = mean_difference([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert lo == pytest.approx(2.0 - 2.484138, abs=1e-6) and hi == pytest.approx(2.0 + 2.484138, abs=1e-6)
    assert mean_difference([0.5]) == (0.5, None, None)  # one pair: no interval
    assert math.isnan(mean_difference([])[0])


def test_paired_p_by_hand_and_against_scipy():
    # t = 2 / (1 / sqrt 3) = 3.4641 with 2 degrees of freedom: p = 2 (1 - F_t2(3.4641)) = 1 - 3.4641 / sqrt(2 + 12)
    # (the t distribution with 2 df has F(t) = 1/2 + t / (2 sqrt(2 + t²)))
    assert paired_p([1.0, 2.0, 3.0]) == pytest.approx(1 - 3.4641016 / math.sqrt(14), abs=1e-6)
    a, b = [2.71, 2.80, 2.75, 2.90, 2.66], [2.78, 2.84, 2.74, 2.99, 2.70]
    assert paired_p([x - y for x, y in zip(a, b)]) == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-12)
    assert paired_p([0.1]) is None and paired_p([0.2, 0.2]) is None  # too few, no spread


def test_holm_order_by_hand():
    # m = 3: sorted 0.01, 0.03, 0.04 -> 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 1·0.04) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([None, 0.02, 0.5, None]) == [None, pytest.approx(0.04), pytest.approx(0.5)] + [None]  # m = 2
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_status_trained_stalled_diverged():
    run = lambda v, s="finished": RunRecord("x", 1, s, v)  # noqa: E731
    assert status(run(2.7), 4.8, 0.5, False) == "trained"
    assert status(run(4.5), 4.8, 0.5, False) == "stalled"  # 0.3 below the unigram level: within the margin
    assert status(run(5.1), 4.8, 0.5, False) == "stalled"
    assert status(run(None, "diverged"), 4.8, 0.5, False) == "diverged"
    assert status(run(12.0), 10.0, 5.0, True) == "stalled"  # higher is better: 2 above chance
    assert status(run(2.7), None, None, False) == "trained"  # no reference: nothing is called stalled


def _records(machines=None):
    machines = machines or {}
    values = {"A": [2.70, 2.80, 2.75], "B": [2.60, 2.72, 2.66], "C": [2.90, 2.80, 2.95]}
    return [RunRecord(label, seed, "finished", v, (machines.get((label, seed), "AMD EPYC (AVX2)"),), "abc1234",
                      1.0 if label == "A" else 1.5)
            for label, vs in values.items() for seed, v in enumerate(vs, 1)]


def test_summarise_pairs_within_blocks():
    rows, header = summarise(_records(), ["A", "B", "C"], "A", reference=4.8, margin=0.5)
    b = rows[1]
    diffs = [2.60 - 2.70, 2.72 - 2.80, 2.66 - 2.75]
    assert b["pairs"] == 3 and b["delta"] == pytest.approx(sum(diffs) / 3)
    assert b["p_paired"] == pytest.approx(stats.ttest_rel([2.60, 2.72, 2.66], [2.70, 2.80, 2.75]).pvalue)
    assert b["p_welch"] == pytest.approx(stats.ttest_ind([2.60, 2.72, 2.66], [2.70, 2.80, 2.75],
                                                         equal_var=False).pvalue)
    ps = [rows[1]["p_paired"], rows[2]["p_paired"]]
    assert [rows[1]["p_holm"], rows[2]["p_holm"]] == pytest.approx(holm(ps))
    assert b["time_ratio"] == pytest.approx(1.5) and rows[0]["time_ratio"] == 1.0
    assert rows[0]["p_paired"] is None and math.isnan(rows[0]["delta"])
    assert (b["trained"], b["stalled"], b["diverged"]) == (3, 0, 0)
    assert header["unpaired"] == [] and not header["mixed"] and header["holm_m"] == 2


def test_a_table_of_two_machines_without_per_machine_baselines_is_flagged():
    """Block 3's B ran on an Intel while its baseline A ran on the AMD: B's pair there is left out and the header
    says so; a block whose runs span two machines is named."""
    records = _records({("B", 3): "Intel Xeon Processor (AVX512)"})
    rows, header = summarise(records, ["A", "B", "C"], "A")
    assert rows[1]["pairs"] == 2 and rows[2]["pairs"] == 3
    # Welch's p too leaves B's Intel run out: B's AMD runs (blocks 1, 2) against A's (every block ran on the AMD)
    assert rows[1]["p_welch"] == pytest.approx(stats.ttest_ind([2.60, 2.72], [2.70, 2.80, 2.75],
                                                               equal_var=False).pvalue)
    assert header["mixed"] and header["unpaired"] == [
        "B seed 3 (Intel Xeon Processor (AVX512); its baseline: AMD EPYC (AVX2))"]
    table = markdown(rows, header, {k: {"connection": k} for k in "ABC"}, "bits per byte", 3)
    assert "WARNING: block seed3 mixes machines (AMD EPYC (AVX2), Intel Xeon Processor (AVX512))" in table
    assert "WARNING: no same-machine baseline, left out of Δ and the paired and Welch p: B seed 3" in table
    # a per-machine baseline in every block: nothing to flag, whatever the machines
    records = _records({(k, 3): "Intel Xeon Processor (AVX512)" for k in "ABC"})
    rows, header = summarise(records, ["A", "B", "C"], "A")
    table = markdown(rows, header, {k: {"connection": k} for k in "ABC"}, "bits per byte", 3)
    assert "WARNING" not in table and rows[1]["pairs"] == 3
    assert rows[1]["p_welch"] == pytest.approx(stats.ttest_ind([2.60, 2.72, 2.66], [2.70, 2.80, 2.75],
                                                               equal_var=False).pvalue)
    # a row of another machine than every baseline run: no Welch p either
    records = _records({("B", s): "Intel Xeon Processor (AVX512)" for s in (1, 2, 3)})
    rows, header = summarise(records, ["A", "B", "C"], "A")
    assert rows[1]["pairs"] == 0 and rows[1]["p_welch"] is None and rows[2]["p_welch"] is not None
    assert "AMD EPYC (AVX2) (seeds 1, 2); Intel Xeon Processor (AVX512) (seed 3)" in table


def test_a_block_without_its_baseline_is_said():
    records = [r for r in _records() if not (r.label == "A" and r.seed == 2)]
    rows, header = summarise(records, ["A", "B", "C"], "A")
    assert rows[1]["pairs"] == 2
    table = markdown(rows, header, {k: {"connection": k} for k in "ABC"}, "bits per byte", 3)
    assert "WARNING: block seed2 has no A run" in table


def test_markdown_says_which_differences_hold():
    values = {"A": [2.70, 2.80, 2.75, 2.72, 2.78], "B": [2.60, 2.71, 2.64, 2.63, 2.69],
              "C": [2.71, 2.79, 2.77, 2.71, 2.80]}
    records = [RunRecord(k, s, "finished", v, ("m",)) for k, vs in values.items() for s, v in enumerate(vs, 1)]
    rows, header = summarise(records, ["A", "B", "C"], "A")
    assert rows[1]["holds"] and not rows[2]["holds"]
    table = markdown(rows, header, {k: {"connection": k} for k in "ABC"}, "bits per byte", 3)
    assert "better than A: B; worse: none" in table
    assert "| -0.096 [" in table and "(5 pairs)" in table  # d = -0.10, -0.09, -0.11, -0.09, -0.09


def test_one_block_is_one_pair():
    records = [RunRecord(k, 1, "finished", v, ("m",)) for k, v in (("A", 2.70), ("B", 2.60))]
    rows, header = summarise(records, ["A", "B"], "A")
    table = markdown(rows, header, {k: {"connection": k} for k in "AB"}, "bits per byte", 3)
    assert "| -0.100 (1 pair) " in table and "pairs)" not in table
    assert "| 2.600 (one run) " in table and "± 0.000" not in table  # one run has no spread to state
    rows_csv = list(csv.DictReader(io.StringIO(to_csv(rows, {k: {"connection": k} for k in "AB"}))))
    assert [(r["mean"], r["std"]) for r in rows_csv] == [("2.7", ""), ("2.6", "")]  # not a std of 0.0 either
    two = [RunRecord(k, s, "finished", v + s / 10, ("m",)) for k, v in (("A", 2.70), ("B", 2.60)) for s in (1, 2)]
    rows, _ = summarise(two, ["A", "B"], "A")
    assert float(next(csv.DictReader(io.StringIO(to_csv(rows, {}))))["std"]) == pytest.approx(math.sqrt(0.005))


def test_exact_wilcoxon_by_hand_and_against_scipy(monkeypatch):
    """d = 1, −2, 3, 4, 5: ranks of |d| 1..5, W⁻ = 2, W⁺ = 13. Of the 2^5 = 32 equally likely sign patterns, those
    with W ≤ 2 on one side are the positive sets {}, {1}, {2}: 3, so p = 2 · 3/32 = 0.1875; all of one sign: the
    smallest attainable p, 2/2^5 = 0.0625."""
    assert wilcoxon_p([1.0, -2.0, 3.0, 4.0, 5.0]) == pytest.approx(6 / 32, abs=1e-12)
    assert wilcoxon_p([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 2 ** 5, abs=1e-12)
    d = [-0.031, -0.052, -0.018, 0.007, -0.044, -0.025]
    assert wilcoxon_p(d) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue, rel=1e-12)
    assert wilcoxon_p([0.3]) is None and wilcoxon_p([0.0, 0.0]) is None
    # the oracle is live: with the normal approximation instead of the exact distribution the hand value is missed
    exact = stats.wilcoxon
    monkeypatch.setattr(stats, "wilcoxon", lambda x, method="exact": exact(x, method="approx"))
    assert wilcoxon_p([1.0, -2.0, 3.0, 4.0, 5.0]) != pytest.approx(6 / 32, abs=1e-3)


def _table(values, states=None, kinds=None):
    states, kinds = states or {}, kinds or {}
    return [RunRecord(k, s, states.get((k, s), "finished"), v, ("m",), kinds=(kinds.get((k, s), "m, fp32"),))
            for k, vs in values.items() for s, v in enumerate(vs, 1)]


VALUES = {"A": [2.70, 2.80, 2.75, 2.72, 2.78], "B": [2.60, 2.71, 2.64, 2.63, 2.69],
          "C": [2.80, 2.91, 2.83, 2.86, 2.88], "D": [2.71, 2.79, 2.77, 2.71, 2.80]}


def test_the_wilcoxon_column_beside_the_t_test():
    rows, header = summarise(_table(VALUES), list(VALUES), "A")
    d = [b - a for a, b in zip(VALUES["A"], VALUES["B"])]
    assert rows[1]["p_wilcoxon"] == pytest.approx(stats.wilcoxon(d, method="exact").pvalue) == 0.0625
    assert rows[0]["p_wilcoxon"] is None
    table = markdown(rows, header, {k: {"connection": k} for k in VALUES}, "bits per byte", 3)
    assert "| p paired | p Wilcoxon |" in table.replace("  ", "")
    assert "with n = 5 blocks the smallest attainable exact Wilcoxon p is 2/2^5 = 0.062" in table
    assert "Kind of machine: m, fp32, every block" in table


def test_a_row_with_a_stalled_or_diverged_run_leaves_holms_family():
    """C stalls in block 2 (2.91, within 0.05 of the reference 2.95): it is no finding. Holm's m falls from 3 to 2, the
    other rows' corrected p with it, and C is listed apart with its runs by status, not in the verdict."""
    rows, header = summarise(_table(VALUES), list(VALUES), "A", reference=3.2, margin=0.05)
    assert header["holm_m"] == 3 and header["failed"] == []
    full = {r["label"]: r["p_holm"] for r in rows}
    rows, header = summarise(_table(VALUES), list(VALUES), "A", reference=2.95, margin=0.05)  # C's 2.91 stalls
    by = {r["label"]: r for r in rows}
    assert header["holm_m"] == 2 and header["failed"] == ["C"]
    assert by["C"]["failed"] and by["C"]["p_holm"] is None and not by["C"]["holds"]
    assert by["C"]["p_paired"] is not None  # computed, but not a member of the family
    assert by["C"]["seeds"] == {"trained": [1, 3, 4, 5], "stalled": [2], "diverged": []}
    ps = [by["B"]["p_paired"], by["D"]["p_paired"]]
    assert [by["B"]["p_holm"], by["D"]["p_holm"]] == pytest.approx(holm(ps))
    assert by["B"]["p_holm"] < full["B"]  # one member fewer: a weaker correction
    # a diverged run fails its row alike
    rows, header = summarise(_table(VALUES, states={("D", 4): "diverged"}), list(VALUES), "A")
    assert header["failed"] == ["D"] and header["holm_m"] == 2
    table = markdown(rows, header, {k: {"connection": k} for k in VALUES}, "bits per byte", 3)
    assert "Failures are not findings: D had a stalled or diverged run" in table
    main, _, apart = table.partition("Rows with a stalled or diverged run")
    assert "| D " not in main and "| D " in apart
    assert "1: 2.710, 2: 2.790, 3: 2.770, 5: 2.800" in apart and "| 4 " in apart.replace("  ", " ")


def test_blocks_of_two_kinds_of_machine_are_refused():
    """Blocks 4 and 5's baseline trained on a GPU in bf16, blocks 1-3's on a CPU: one paired analysis would pool
    two kinds, refused in one line naming each kind's seeds; a design of another kind than its block's baseline
    (one block finished elsewhere) is left unpaired instead."""
    gpu = {(k, s): "NVIDIA H100 80GB HBM3, bf16 autocast" for k in VALUES for s in (4, 5)}
    with pytest.raises(ValueError) as err:
        summarise(_table(VALUES, kinds=gpu), list(VALUES), "A")
    message = str(err.value)
    assert "\n" not in message and "seeds 1, 2, 3 on m, fp32" in message
    assert "seeds 4, 5 on NVIDIA H100 80GB HBM3, bf16 autocast" in message
    rows, header = summarise(_table(VALUES, kinds={("B", 5): "m, bf16 autocast"}), list(VALUES), "A")
    assert rows[1]["pairs"] == 4 and header["unpaired"] == ["B seed 5 (m, bf16 autocast; its baseline: m, fp32)"]
    assert one_kind({1: "x", 2: "x"}) == "x" and one_kind({}) is None


def test_holm_counts_one_experiment_once():
    """Four cells, two experiments: cells 1-2 are one pair of runs (p 0.01), cells 3-4 another (p 0.04). Holm over
    m = 2: 2 · 0.01 = 0.02, max(0.02, 1 · 0.04) = 0.04 — not m = 4 (0.04, 0.04, 0.08, 0.08)."""
    ps = [0.01, 0.01, 0.04, 0.04, None]
    keys = ["x", "x", "y", "y", "z"]
    assert holm_once(ps, keys) == [pytest.approx(0.02)] * 2 + [pytest.approx(0.04)] * 2 + [None]
    assert holm(ps) == [pytest.approx(0.04)] * 2 + [pytest.approx(0.08)] * 2 + [None]  # each copy counted
    assert holm_once(ps, list(range(5))) == holm(ps)  # distinct experiments: plain Holm


def test_a_block_whose_baseline_stalled_pairs_no_row_and_the_baseline_is_listed_apart():
    """A stalls in block 2 (2.98 within 0.05 of the reference 3.0; every other run is 0.09 or more below it): B, C and
    D have no pair there (four, not five), A's row is a failure like any other, and the header names the block."""
    values = {label: list(seeds) for label, seeds in VALUES.items()}
    values["A"][1] = 2.98
    rows, header = summarise(_table(values), list(values), "A", reference=3.0, margin=0.05)
    by = {r["label"]: r for r in rows}
    assert header["failed"] == ["A"] and header["baseline_failed"] == [2] and by["A"]["failed"]
    kept = [0, 2, 3, 4]  # seeds 1, 3, 4, 5
    for label in "BCD":
        mine, base = [values[label][i] for i in kept], [values["A"][i] for i in kept]
        assert by[label]["pairs"] == 4 and not by[label]["failed"]
        assert by[label]["delta"] == pytest.approx(sum(m - b for m, b in zip(mine, base)) / 4)
        assert by[label]["p_paired"] == pytest.approx(stats.ttest_rel(mine, base).pvalue)
    assert header["holm_m"] == 3
    table = markdown(rows, header, {k: {"connection": k} for k in values}, "bits per byte", 3)
    assert "The baseline A stalled or diverged in block seed 2: no row is paired there." in table
    main, _, apart = table.partition("Rows with a stalled or diverged run")
    assert "| A " not in main and "| A " in apart
