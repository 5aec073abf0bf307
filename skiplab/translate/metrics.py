"""Corpus BLEU and chrF with sacrebleu, BLEU in the two forms papers report, and Koehn's paired bootstrap.

Scores are sacrebleu's with its defaults (Post 2018, "A Call for Clarity in Reporting BLEU Scores"):
BLEU with the 13a tokenizer, exponential smoothing, one reference; chrF with character n-grams up to
6 and beta = 2 (Popović 2015). Report the signature string with every score.

The papers report *tokenised* BLEU instead: Moses' ``multi-bleu.perl`` on tokenised, case-sensitive
text (the depth-wise LSTM paper, Section 5.1, says so). :func:`bleu_tok` is that: sacrebleu with
``tokenize="none"`` (split on whitespace, as multi-bleu.perl does) and ``smooth_method="none"``
(multi-bleu.perl's log of a zero precision makes the score 0). It depends on the tokenisation, so it
is comparable only between systems scored on the same tokenised references; :func:`bleu_forms`
makes the two forms of a test set (:class:`BleuForms`), :func:`score_forms` scores both.

Both metrics are functions of corpus-level sums of per-sentence statistics, so the bootstrap
computes those statistics once and only re-sums them per resample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.bleu import MAX_NGRAM_ORDER

from ..tokenization import moses

METRICS = ("bleu", "bleu_tok", "chrf")


def _check(refs: Sequence[str], **systems: Sequence[str]) -> None:
    """Raise ValueError unless every system has one line per reference line and there is at least one."""
    counts = {name: len(lines) for name, lines in {"refs": refs, **systems}.items()}
    if len(set(counts.values())) > 1:
        raise ValueError("line counts differ: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    if counts["refs"] == 0:
        raise ValueError("no sentences to score")


def _metric(metric: str) -> BLEU | CHRF:
    if metric == "bleu":
        return BLEU()
    if metric == "bleu_tok":
        return BLEU(tokenize="none", smooth_method="none", force=True)  # tokenised on purpose: no warning
    if metric == "chrf":
        return CHRF()
    raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")


def bleu(hyps: list[str], refs: list[str], lowercase: bool = False) -> tuple[float, str]:
    """Corpus BLEU (0-100) of ``hyps`` against one reference each, and sacrebleu's signature.

    BLEU = BP · exp(1/4 Σ_n log p_n), BP = min(1, exp(1 - r/c)) (Papineni et al. 2002), with the
    statistics summed over the corpus, not averaged over sentences. ``lowercase`` compares lowercased
    text (signature ``case:lc``), the way some published results are scored.
    """
    _check(refs, hyps=hyps)
    scorer = BLEU(lowercase=lowercase)
    return scorer.corpus_score(list(hyps), [list(refs)]).score, scorer.get_signature().format()


def bleu_tok(hyps: list[str], refs: list[str], tokenization: str = "") -> tuple[float, str]:
    """Tokenised, case-sensitive corpus BLEU (0-100) as ``multi-bleu.perl`` computes it, and its signature.

    ``hyps`` and ``refs`` must already be tokenised (tokens separated by spaces): the n-grams are their
    whitespace-separated tokens (sacrebleu ``tokenize="none"``), with no smoothing (a corpus without a
    matching 4-gram scores 0). ``tokenization`` says how the text was tokenised; it goes into the
    signature as ``tok:none(<tokenization>)``.
    """
    _check(refs, hyps=hyps)
    scorer = _metric("bleu_tok")
    return scorer.corpus_score(list(hyps), [list(refs)]).score, _tok_signature(scorer, tokenization)


def _tok_signature(scorer: BLEU, tokenization: str) -> str:
    signature = scorer.get_signature().format()
    return signature.replace("tok:none", f"tok:none({tokenization})") if tokenization else signature


def chrf(hyps: list[str], refs: list[str]) -> tuple[float, str]:
    """Corpus chrF (0-100, sacrebleu's CHRF defaults: char order 6, beta 2) and its signature."""
    _check(refs, hyps=hyps)
    scorer = CHRF()
    return scorer.corpus_score(list(hyps), [list(refs)]).score, scorer.get_signature().format()


def sentence_stats(hyps: list[str], refs: list[str], metric: str = "bleu") -> np.ndarray:
    """Per-sentence sufficient statistics (n, d) whose column sums determine the corpus score.

    BLEU rows: [hyp length, ref length, matches_1..4, totals_1..4] (sacrebleu's layout);
    chrF rows: [hyp, ref, match] counts per character n-gram order. This uses
    ``Metric._extract_corpus_statistics``, the hook sacrebleu's own significance tests use.
    """
    return _stats(hyps, refs, metric)[0]


def _stats(hyps: list[str], refs: list[str], metric: str) -> tuple[np.ndarray, str]:
    """:func:`sentence_stats` and the signature of the scorer that computed them."""
    _check(refs, hyps=hyps)
    scorer = _metric(metric)
    stats = scorer._extract_corpus_statistics(list(hyps), [list(refs)])
    return np.asarray(stats, dtype=np.float64), scorer.get_signature().format()


@dataclass(frozen=True)
class BleuForms:
    """One system's translations and their references in both forms BLEU is reported on.

    ``tok_*``: tokenised text, for :func:`bleu_tok` (and ``paired_bootstrap(..., metric="bleu_tok")``);
    ``detok_*``: plain text, for sacrebleu's 13a :func:`bleu`, :func:`chrf` (and the default bootstrap).
    """

    tok_hyps: list[str]
    tok_refs: list[str]
    detok_hyps: list[str]
    detok_refs: list[str]
    tokenization: str  # how the tokenised form came about, e.g. "moses-tokenised refs"
    detokenizer: str | None  # what made the detokenised form, None when it is the text as given

    @property
    def tokenized(self) -> tuple[list[str], list[str]]:
        """(hypotheses, references), tokenised."""
        return self.tok_hyps, self.tok_refs

    @property
    def detokenized(self) -> tuple[list[str], list[str]]:
        """(hypotheses, references), detokenised."""
        return self.detok_hyps, self.detok_refs


def bleu_forms(hyps: list[str], refs: list[str], tokenized: bool, lang: str) -> BleuForms:
    """Both forms of ``hyps`` (a system's output) and ``refs`` in target language ``lang``.

    ``tokenized``: the references are Moses-tokenised with the entities unescaped (a corpus read with
    :attr:`~skiplab.corpora.Parallel.tokenized`), and so are the hypotheses of a model trained on them.
    That text is the tokenised form; detokenising both sides with sacremoses' ``MosesDetokenizer(lang)``
    gives the other. (Moses' escaping is one-to-one, so tokens that match unescaped match escaped: the
    tokenised score is multi-bleu.perl's on the published escaped references.) Otherwise (raw text, as Multi30k) the text is the detokenised form, and
    sacremoses' ``MosesTokenizer(lang)`` on both sides gives the tokenised one.
    """
    _check(refs, hyps=hyps)
    hyps, refs = list(hyps), list(refs)
    if tokenized:
        return BleuForms(hyps, refs, moses.detokenize(hyps, lang), moses.detokenize(refs, lang),
                         "moses-tokenised refs", moses.detokenizer_name(lang))
    return BleuForms(moses.tokenize(hyps, lang), moses.tokenize(refs, lang), hyps, refs,
                     moses.tokenizer_name(lang), None)


def score_forms(forms: BleuForms) -> dict[str, Any]:
    """Every score of a test set: sacrebleu's on the detokenised form (``bleu``, ``bleu_lowercase``, ``chrf``)
    and tokenised BLEU (``bleu_tok``), each with its ``..._signature``, and the ``detokenizer`` used."""
    b, b_sig = bleu(forms.detok_hyps, forms.detok_refs)
    b_lc, b_lc_sig = bleu(forms.detok_hyps, forms.detok_refs, lowercase=True)
    c, c_sig = chrf(forms.detok_hyps, forms.detok_refs)
    t, t_sig = bleu_tok(forms.tok_hyps, forms.tok_refs, forms.tokenization)
    return {"bleu": b, "bleu_signature": b_sig, "bleu_lowercase": b_lc, "bleu_lowercase_signature": b_lc_sig,
            "chrf": c, "chrf_signature": c_sig, "bleu_tok": t, "bleu_tok_signature": t_sig,
            "detokenizer": forms.detokenizer}


def score_from_stats(stats: np.ndarray, metric: str = "bleu") -> np.ndarray:
    """Corpus scores from summed statistics: ``stats`` (d,) or (k, d) -> score () or (k,).

    BLEU is vectorised here, reproducing sacrebleu's ``BLEU.compute_bleu`` with 'exp' smoothing
    (NIST mteval-v13a, Chen & Cherry 2014 method 3): p_n = m_n / t_n, but the k-th order with
    m_n = 0 gets p_n = 1 / (2^k t_n); the score is 0 if no n-gram matches or some t_n = 0;
    BP = exp(1 - r/c) if c < r (0 if c = 0). ``bleu_tok`` has no smoothing: 0 as soon as some m_n = 0
    (multi-bleu.perl). chrF goes through sacrebleu row by row.
    """
    stats = np.asarray(stats, dtype=np.float64)
    flat = stats.reshape(-1, stats.shape[-1])
    if metric == "chrf":
        scorer = CHRF()
        scores = np.array([scorer._compute_score_from_stats(list(row)).score for row in flat])
        return scores.reshape(stats.shape[:-1])
    if metric not in ("bleu", "bleu_tok"):
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    sys_len, ref_len = flat[:, 0], flat[:, 1]
    order = MAX_NGRAM_ORDER  # sacrebleu default, 4
    matches, totals = flat[:, 2 : 2 + order], flat[:, 2 + order : 2 + 2 * order]
    zero = matches == 0
    nth_zero = np.cumsum(zero, axis=1)  # k for the k-th order without matches
    with np.errstate(divide="ignore", invalid="ignore"):
        smoothed = 1.0 / (2.0**nth_zero * totals) if metric == "bleu" else np.ones_like(totals)
        precision = np.where(zero, smoothed, matches / totals)  # unsmoothed zeros are ruled out by ``valid``
        log_mean = np.log(100.0 * precision).mean(axis=1)
        bp = np.where(sys_len < ref_len, np.exp(1.0 - ref_len / sys_len), 1.0)
    matched = (matches > 0).any(axis=1) if metric == "bleu" else (matches > 0).all(axis=1)
    valid = (totals > 0).all(axis=1) & matched & (sys_len > 0)
    scores = np.where(valid, bp * np.exp(np.where(valid, log_mean, 0.0)), 0.0)
    return scores.reshape(stats.shape[:-1])


def _resampled_scores(stats: np.ndarray, indices: np.ndarray, metric: str) -> np.ndarray:
    """Scores of the corpora given by rows of ``indices`` (k, n): counts (k, n) @ stats (n, d)."""
    k, n = indices.shape
    flat = (indices + n * np.arange(k)[:, None]).ravel()
    counts = np.bincount(flat, minlength=k * n).reshape(k, n).astype(np.float64)
    return score_from_stats(counts @ stats, metric)


def _ci95(scores: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval of the bootstrap scores (Efron & Tibshirani 1993)."""
    return float(np.percentile(scores, 2.5)), float(np.percentile(scores, 97.5))


def paired_bootstrap(
    refs: list[str],
    sys_a: list[str],
    sys_b: list[str],
    n_samples: int = 1000,
    seed: int = 12345,
    metric: str = "bleu",
) -> dict:
    """Paired bootstrap resampling (Koehn 2004, "Statistical Significance Tests for MT Evaluation").

    Draws ``n_samples`` test sets of n sentence indices with replacement (``np.random.default_rng(seed)``),
    the same indices for A and B, and scores both corpora on each. Returns the full-set scores ``a``
    and ``b``; per system the bootstrap mean and 95% percentile interval (``a_mean``, ``a_ci95``, ...);
    ``wins_a`` / ``wins_b``, the fraction of samples where that system scores strictly higher;
    ``better`` ('a', 'b' or 'tie' on the full set) and ``p_value`` = 1 - wins of the better system
    (the fraction of samples where it is not ahead; 1.0 for a tie), plus ``n_samples``, ``metric`` and
    ``signature``. ``metric="bleu_tok"`` resamples tokenised BLEU: give it the tokenised form of
    :func:`bleu_forms` (``refs=forms_a.tok_refs``, ``sys_a=forms_a.tok_hyps``, ``sys_b=forms_b.tok_hyps``).
    """
    _check(refs, sys_a=sys_a, sys_b=sys_b)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    stats_a, signature = _stats(sys_a, refs, metric)
    stats_b, _ = _stats(sys_b, refs, metric)
    n = len(refs)
    score_a = float(score_from_stats(stats_a.sum(axis=0), metric))
    score_b = float(score_from_stats(stats_b.sum(axis=0), metric))

    rng = np.random.default_rng(seed)
    boot_a, boot_b = np.empty(n_samples), np.empty(n_samples)
    # Drawn in chunks to bound the (chunk, n) index and count matrices to ~16 MB each; the chunking
    # depends only on n, so a seed always gives the same samples for the same test set size.
    chunk = max(1, 2_000_000 // n)
    for lo in range(0, n_samples, chunk):
        hi = min(n_samples, lo + chunk)
        indices = rng.integers(0, n, size=(hi - lo, n))
        boot_a[lo:hi] = _resampled_scores(stats_a, indices, metric)
        boot_b[lo:hi] = _resampled_scores(stats_b, indices, metric)

    wins_a, wins_b = float(np.mean(boot_a > boot_b)), float(np.mean(boot_b > boot_a))
    better = "a" if score_a > score_b else "b" if score_b > score_a else "tie"
    p_value = 1.0 - {"a": wins_a, "b": wins_b, "tie": 0.0}[better]
    return {
        "a": score_a,
        "b": score_b,
        "a_mean": float(boot_a.mean()),
        "a_ci95": _ci95(boot_a),
        "b_mean": float(boot_b.mean()),
        "b_ci95": _ci95(boot_b),
        "wins_a": wins_a,
        "wins_b": wins_b,
        "p_value": p_value,
        "better": better,
        "n_samples": n_samples,
        "metric": metric,
        "signature": signature,
    }
