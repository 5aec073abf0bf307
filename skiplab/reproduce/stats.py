"""The statistics of a reproduced table: mean ± std over seeds and the significance of a row's difference.

- error / accuracy: Welch's t-test over the seeds of the row and of its baseline (unequal variances;
  Welch 1947), two-sided, ``scipy.stats.ttest_ind(equal_var=False)``; undefined (None) with fewer than two
  seeds on a side or no spread on either.
- BLEU: paired bootstrap resampling (Koehn 2004) between the seed-matched test translations of the row
  and of the baseline, on the form of BLEU the table reports; one p-value per seed pair.
"""

from __future__ import annotations

import math

from ..analysis.comparison import mean_std, welch_p

__all__ = ["summary", "welch_p"]


def summary(values: list[float]) -> dict[str, float | int | None]:
    """n, mean and sample standard deviation (n - 1) of the values that exist."""
    mean, std = mean_std(values)
    return {"n": len(values), "mean": None if math.isnan(mean) else mean, "std": None if math.isnan(std) else std}
