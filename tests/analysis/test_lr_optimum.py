"""The optimum of a learning-rate sweep, its seed bootstrap and its slope across depth (skiplab.analysis.lr_optimum),
against hand computation and numpy's fits."""

import math
import random

import numpy as np
import pytest

from skiplab.analysis import lr_optimum
from skiplab.analysis.lr_optimum import optimum, slope, vertex

GRID = [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]


def test_the_vertex_by_hand_and_by_the_equally_spaced_formula():
    # x = 0, 1, 2; y = 3, 1, 2: Δ₁ = −2, Δ₂ = 1, a = 1.5, b = −2 − 1.5·1 = −3.5, x* = 3.5 / 3
    assert vertex([0.0, 1.0, 2.0], [3.0, 1.0, 2.0]) == pytest.approx(7 / 6, abs=1e-12)
    # x₁ + h (y₀ − y₂) / (2 (y₀ − 2y₁ + y₂)) with h = 1
    assert vertex([0.0, 1.0, 2.0], [3.0, 1.0, 2.0]) == pytest.approx(1 + (3 - 2) / (2 * (3 - 2 + 2)), abs=1e-12)


def test_the_vertex_is_numpys_quadratic_fit_through_three_points():
    rng = random.Random(3)
    for _ in range(50):
        xs = sorted(rng.uniform(-12, -5) for _ in range(3))
        if min(b - a for a, b in zip(xs, xs[1:])) < 0.3:
            continue
        centre = rng.uniform(xs[0], xs[2])
        ys = [0.7 * (x - centre) ** 2 + 2.5 + rng.uniform(-0.01, 0.01) for x in xs]
        a, b, _ = np.polyfit(xs, ys, 2)
        if a <= 0:
            continue
        expected = min(max(-b / (2 * a), xs[0]), xs[2])
        assert vertex(xs, ys) == pytest.approx(expected, abs=1e-9)


def test_the_vertex_stays_in_the_bracket_and_a_concave_one_takes_the_lowest_point():
    assert vertex([0.0, 1.0, 2.0], [1.0, 2.5, 5.0]) == 0.0  # a = 0.5, b = 1: x* = −1, left of x₀: clipped
    assert vertex([0.0, 1.0, 2.0], [5.0, 2.5, 1.0]) == 2.0  # and right of x₂
    assert vertex([0.0, 1.0, 2.0], [2.0, 3.0, 1.0]) == 2.0  # opens downwards: the lowest of the three
    assert vertex([0.0, 1.0, 2.0], [2.0, 2.0, 2.0]) == 0.0  # flat: the first of the lowest


def test_the_percentiles_are_numpys():
    rng = random.Random(5)
    for n in (1, 2, 7, 100):
        values = [rng.gauss(0, 1) for _ in range(n)]
        lo, hi = lr_optimum._percentiles(values)
        assert (lo, hi) == pytest.approx(tuple(np.percentile(values, [2.5, 97.5])), abs=1e-12)


def _runs(curve, seeds=(1, 2, 3), lrs=GRID, offsets=None, status=None):
    """Runs whose value is curve(log2 lr) plus the seed's offset; ``status`` maps (lr, seed) to a failure."""
    offsets = offsets or {k: 0.0 for k in seeds}
    out = []
    for lr in lrs:
        for k in seeds:
            s = (status or {}).get((lr, k), "finished")
            out.append({"lr": lr, "seed": k, "status": s,
                        "value": curve(math.log2(lr)) + offsets[k] if s == "finished" else None})
    return out


def test_a_parabola_in_log_lr_gives_its_vertex_and_the_paired_bootstrap_cancels_each_seeds_offset():
    centre = math.log2(1e-3) + 0.3
    curve = lambda x: 0.05 * (x - centre) ** 2 + 2.4  # noqa: E731
    runs = _runs(curve, offsets={1: 0.0, 2: 0.04, 3: -0.03})  # a seed is better or worse at every lr alike
    o = optimum(runs, GRID, samples=300)
    assert o["status"] == "bracketed" and o["best_grid_lr"] == 1e-3 and o["seeds"] == 3
    assert o["x_star"] == pytest.approx(centre, abs=1e-9)
    assert o["lr_star"] == pytest.approx(2 ** centre)
    # the same seeds at the three lrs: every replicate's means are the curve plus one shared offset
    assert o["ci"] == pytest.approx([2 ** centre, 2 ** centre], rel=1e-9)
    assert len(o["replicates"]) == 300


def test_seeds_that_disagree_about_the_optimum_widen_the_interval_around_it():
    runs = []
    for k, c in ((1, -10.2), (2, -9.8), (3, -10.0), (4, -9.9)):
        runs += _runs(lambda x, c=c: 0.05 * (x - c) ** 2 + 2.4, seeds=(k,))
    o = optimum(runs, GRID, samples=2000, seed=1)
    lo, hi = (math.log2(v) for v in o["ci"])
    assert lo < o["x_star"] < hi
    assert -10.2 <= lo < -10.0 and -9.9 < hi <= -9.8  # within the seeds' own optima, and not one point
    assert optimum(runs, GRID, samples=2000, seed=1)["ci"] == o["ci"]  # seeded: the same interval again


def test_the_edges_of_the_grid_an_open_bracket_and_nothing_stable():
    low = optimum(_runs(lambda x: (x + 13) ** 2), GRID)
    assert low["status"] == "edge" and low["best_grid_lr"] == 2.5e-4 and low["lr_star"] is None
    assert "lowest (0.00025)" in low["why"] and "below" in low["why"]
    high = optimum(_runs(lambda x: (x + 7) ** 2), GRID)
    assert high["status"] == "edge" and high["best_grid_lr"] == 4e-3 and "above" in high["why"]
    # a neighbour's seed diverged: the bracket is open, the best grid lr still stands
    curve = lambda x: (x - math.log2(1e-3)) ** 2  # noqa: E731
    opened = optimum(_runs(curve, status={(2e-3, 2): "diverged"}), GRID)
    assert opened["status"] == "open" and opened["best_grid_lr"] == 1e-3 and "0.002" in opened["why"]
    assert next(c for c in opened["cells"] if c["lr"] == 2e-3)["stable"] is False
    dead = optimum(_runs(curve, status={(lr, 1): "diverged" for lr in GRID}, seeds=(1,)), GRID)
    assert dead["status"] == "none" and dead["best_grid_lr"] is None


def test_the_seeded_lrs_decide_and_a_one_seed_grid_point_does_not_beat_them():
    centre = math.log2(1e-3)
    curve = lambda x: 0.05 * (x - centre) ** 2 + 2.4  # noqa: E731
    runs = _runs(curve, lrs=[5e-4, 1e-3, 2e-3])
    runs += [{"lr": 2.5e-4, "seed": 1, "status": "finished", "value": 0.1},  # lower, but one seed only
             {"lr": 4e-3, "seed": 1, "status": "finished", "value": 9.0}]
    o = optimum(runs, GRID, samples=200)
    assert o["best_grid_lr"] == 1e-3 and o["status"] == "bracketed" and o["seeds"] == 3


def test_one_seed_gives_the_vertex_without_an_interval():
    o = optimum(_runs(lambda x: (x + 10) ** 2, seeds=(1,)), GRID)
    assert o["status"] == "bracketed" and o["ci"] is None and o["why"] == "one seed: no interval"
    assert o["x_star"] == pytest.approx(-10.0)


def test_higher_is_better_looks_for_the_maximum():
    o = optimum(_runs(lambda x: -((x + 10) ** 2)), GRID, higher_is_better=True, samples=100)
    assert o["best_grid_lr"] == 1e-3 and o["x_star"] == pytest.approx(-10.0)


def test_a_run_off_the_grid_is_an_error():
    with pytest.raises(ValueError, match="lr 0.003 is off the grid"):
        optimum([{"lr": 3e-3, "seed": 1, "status": "finished", "value": 1.0}], GRID)


def _optimum_at(x, seeds=(1, 2, 3), spread=0.0):
    offsets = {k: spread * (k - 2) for k in seeds}
    return optimum(_runs(lambda v: 0.05 * (v - x) ** 2 + 2.4, seeds=seeds, offsets=offsets), GRID, samples=200)


def test_the_slope_across_depth_by_hand_and_numpys_line():
    depths = [4, 8, 16, 32]
    xs = [-9.6 - 0.5 * math.log2(d / 4) + e for d, e in zip(depths, (0.0, 0.05, -0.04, 0.02))]
    s = slope([(d, _optimum_at(x)) for d, x in zip(depths, xs)])
    expected = np.polyfit([math.log2(d) for d in depths], xs, 1)[0]
    assert s["slope"] == pytest.approx(expected, abs=1e-9)
    assert s["ci"] == pytest.approx([expected, expected], abs=1e-9)  # every replicate is the point estimate here
    assert s["verdict"] == "falls" and s["depths"] == depths


def test_a_flat_optimum_shows_no_shift_and_a_rising_one_rises():
    flat = slope([(d, _optimum_at(-10.0)) for d in (4, 16)])
    assert flat["slope"] == pytest.approx(0.0, abs=1e-12) and flat["verdict"] == "no shift shown"
    rising = slope([(4, _optimum_at(-10.4)), (16, _optimum_at(-9.6))])
    assert rising["slope"] == pytest.approx(0.4) and rising["verdict"] == "rises"


def test_the_slope_leaves_out_what_is_not_bracketed_and_needs_two_depths():
    edge = optimum(_runs(lambda x: (x + 13) ** 2), GRID)
    s = slope([(4, _optimum_at(-10.0)), (8, edge)])
    assert s["slope"] is None and s["left_out"] == [8] and "fewer than two" in s["verdict"]
    one = slope([(4, _optimum_at(-10.0, seeds=(1,))), (8, _optimum_at(-10.2, seeds=(1,)))])
    assert one["slope"] == pytest.approx(-0.2) and one["ci"] is None and "one seed" in one["verdict"]


def test_a_cliff_on_one_side_moves_the_vertex_at_most_half_a_step():
    rng = random.Random(7)
    for _ in range(200):
        y1 = rng.uniform(2, 3)
        y0, y2 = y1 + rng.expovariate(1.0), y1 + rng.expovariate(0.01)  # one side up to a cliff
        assert 0.5 - 1e-12 <= vertex([0.0, 1.0, 2.0], [y0, y1, y2]) <= 1.5 + 1e-12
    assert vertex([0.0, 1.0, 2.0], [2.9, 2.7, 1e6]) == pytest.approx(0.5, abs=1e-5)
