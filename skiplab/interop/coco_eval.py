"""The COCO caption metrics (``pip install pycocoevalcap``: the COCO caption evaluation code, tylin/coco-caption,
as a package; imported when used, read from version 1.2): BLEU-1..4, METEOR, ROUGE-L, CIDEr-D and SPICE of candidate
captions against reference captions, each image an id.

    from skiplab.interop.coco_eval import score, CiderD
    s = score({1: ["A dog runs.", "A brown dog running on grass."]}, {1: "a dog is running"})
    s["Bleu_4"], s["METEOR"], s["ROUGE_L"], s["CIDEr"], s["SPICE"]  # a number, or a string saying why none
    s["per_image"]["CIDEr"][1], s["tokenizer"]                      # per-image scores; how the text was tokenised
    reward = CiderD(train_references)                               # SCST's CIDEr-D: df from training references
    mean, per_id = reward(tokenised_candidates, tokenised_references)

Tokenisation (``tokenizer/ptbtokenizer.py``): every caption goes through Stanford CoreNLP 3.4.1's PTBTokenizer,
``java -cp stanford-corenlp-3.4.1.jar edu.stanford.nlp.process.PTBTokenizer -preserveLines -lowerCase``, one
caption a line, and the tokens in ``PUNCTUATIONS`` are dropped. The filter runs on the lowercased output, so the
bracket tokens it lists as ``-LRB-``, ``-RRB-``, ``-LCB-``, ``-RCB-`` arrive as ``-lrb-`` ... and are kept (so are
``-lsb-``/``-rsb-`` and runs such as ``!!`` or ``?!``, which it never lists). Where java or pycocoevalcap is missing
(or the tokenizer fails), :func:`approximate_ptb` stands in: pure Python, the same lowercasing and the same dropped
tokens, PTB's splits of the common cases (punctuation off words, ``n't``/``'s``/``'re``/``'ve``/``'ll``/``'d``/
``'m`` split off, brackets as ``-lrb-``..., quotes dropped, ``1,000``/``12:30``/``3.5``/``u.s.``/``mr.``/
hyphenated words/URLs kept whole, ``gonna``/``cannot`` split); it differs on rarer text (currency other than
``$``, emoticons, HTML entities, PTB's longer abbreviation list). The result then says so:
``Tokenized.approximate`` is True, ``Tokenized.tokenizer`` and :func:`score`'s ``"tokenizer"`` say why, and a
warning is issued.

The metrics, as the toolkit computes them on the tokenised text (c: a candidate, r_1..r_m: its references):

- BLEU (Papineni et al. 2002, "BLEU: a method for automatic evaluation of machine translation", ACL;
  ``bleu/bleu_scorer.py``, option ``closest``): corpus-level. p_n = Σ_images Σ_g min(count_c(g), max_j
  count_rj(g)) / Σ_images (|c| − n + 1)⁺ over the n-grams g (clipped counts; 1e-15 added above, 1e-9 below);
  brevity penalty BP = exp(1 − R/C) where C = Σ|c| < R = Σ of each image's reference length closest to |c|
  (a tie goes to the shorter), else 1; Bleu_N = BP · (p_1 ⋯ p_N)^(1/N), N = 1..4. Per image: the same over
  that image alone, where the 1e-15 shows: an image with no matching 4-gram has Bleu_4 of order 1e-4, not 0.
- METEOR 1.5 (Denkowski & Lavie 2014, "Meteor Universal: language specific translation evaluation for any
  target language", WMT; ``meteor/meteor.py``): ``meteor-1.5.jar - - -stdio -l en -norm``, task ``rank``:
  modules exact, stem, synonym, paraphrase weighted 1.0, 0.6, 0.8, 0.6; α = 0.85, β = 0.2, γ = 0.6, δ = 0.75
  (the jar's own report of its English defaults). P and R are the weighted matched fractions (content words
  weighted δ, function words 1 − δ); F_mean = P R / (α P + (1 − α) R); Pen = γ (chunks / matches)^β;
  score = (1 − Pen) F_mean against the best of the references. The corpus number is the jar's score of the
  summed statistics of all images, not the mean of the per-image scores.
- ROUGE-L (Lin 2004, "ROUGE: a package for automatic evaluation of summaries", ACL workshop;
  ``rouge/rouge.py``): per image P = max_j LCS(c, r_j) / |c| and R = max_j LCS(c, r_j) / |r_j| (each maximum
  taken on its own, possibly from different references), F = (1 + β²) P R / (R + β² P) with β = 1.2 (0 where P
  or R is 0); the corpus number is the mean over images.
- CIDEr-D (Vedantam, Zitnick & Parikh 2015, "CIDEr: consensus-based image description evaluation", CVPR): what
  pycocoevalcap calls ``CIDEr`` (``cider/cider_scorer.py``) is the CIDEr-D of the COCO server. For n = 1..4 the
  vector g^n(s) of a sentence has one entry per n-gram, tf(g, s) · log(N / max(1, df(g))), tf the raw count, N
  the number of images evaluated and df(g) the number of them with g in any of their references (candidates do
  not count); CIDEr-D_n(c, R) = (1/m) Σ_j exp(−(|c| − |r_j|)² / (2σ²)) · Σ_g min(g^n_g(c), g^n_g(r_j)) g^n_g(r_j)
  / (‖g^n(c)‖ ‖g^n(r_j)‖) with σ = 6 (the Gaussian length penalty; min clips the candidate's counts to the
  reference's, as both share the idf); CIDEr-D = 10 · (1/4) Σ_n CIDEr-D_n, the corpus number the mean over
  images. (The toolkit measures |·| in bigrams, |s| − 1, which gives the same difference wherever the score is
  not 0 anyway.) With one image every idf is log 1 = 0 and the toolkit gives 0 whatever the captions:
  :func:`score` reports a reason instead.
- SPICE (Anderson et al. 2016, "SPICE: semantic propositional image caption evaluation", ECCV;
  ``spice/spice.py``): needs Stanford CoreNLP 3.6.0's jar and models in pycocoevalcap's ``spice/lib``, which
  the toolkit downloads on first use; where they are absent (no network here) SPICE is a reason string, never a
  download. Where present and java runs it is the toolkit's mean "All" F-score.

:class:`CiderD` is the reward of self-critical sequence training (Rennie et al. 2017, "Self-critical sequence
training for image captioning", CVPR): the same CIDEr-D, with N and df fixed once from the training references
instead of from the images scored. pycocoevalcap's ``CiderScorer`` cannot take them (``compute_score``
recounts df from the scored references and ``compute_cider`` resets N to their number), so the formula above is
written out here; with df from the scored references it gives the toolkit's ``Cider`` numbers (tested).

Bad input (a candidate without references, references without a candidate, an empty reference list, a caption
that is not a string) is a one-line ValueError naming the id.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import warnings
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

METRICS = ("BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
BLEU_NAMES = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")
# tokenizer/ptbtokenizer.py's PUNCTUATIONS (pycocoevalcap 1.2): the tokens dropped after PTB tokenisation
PUNCTUATIONS = ("''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...",
                ";")
PTB = "PTBTokenizer (Stanford CoreNLP 3.4.1, java -preserveLines -lowerCase) and pycocoevalcap's PUNCTUATIONS"
INSTALL = "pycocoevalcap is not installed: pip install skiplab[caption]"
SPICE_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")  # in spice/lib, fetched on first use


# -- tokenisation -------------------------------------------------------------------------------------
class Tokenized(dict):
    """:func:`tokenize`'s result: id -> tokenised captions (tokens joined by spaces), with ``approximate`` (True
    where :func:`approximate_ptb` stood in for the PTBTokenizer) and ``tokenizer`` (what made them, and why)."""

    def __init__(self, captions: Mapping[Hashable, list[str]], approximate: bool, tokenizer: str) -> None:
        super().__init__(captions)
        self.approximate, self.tokenizer = approximate, tokenizer


def _java_missing() -> str | None:
    return None if shutil.which("java") else "no java on PATH"


def _package_missing() -> str | None:
    try:
        import pycocoevalcap  # noqa: F401
    except ImportError:
        return INSTALL
    return None


def unavailable(metric: str) -> str | None:
    """Why :func:`score` could not compute ``metric`` (one of :data:`METRICS`) on this machine, before any caption
    is made: pycocoevalcap not installed, or (METEOR, SPICE) no java; None where nothing is missing that can be
    known beforehand (a metric can still fail on its input: CIDEr-D of one image, a jar that dies)."""
    names = {m.lower(): m for m in METRICS}
    if metric.lower() not in names:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    java = names[metric.lower()] in ("METEOR", "SPICE")
    return _package_missing() or (_java_missing() if java else None)


def tokenize(captions: Mapping[Hashable, Sequence[str]]) -> Tokenized:
    """Each id's captions tokenised as the COCO toolkit does (the module docstring): its PTBTokenizer where java
    and pycocoevalcap are there, else :func:`approximate_ptb`, marked and warned about."""
    _check_captions(captions, "captions")
    why = _package_missing() or _java_missing()
    if why is None:
        try:
            return Tokenized(_ptb(captions), False, PTB)
        except (OSError, RuntimeError) as e:
            why = f"PTBTokenizer failed: {' '.join(str(e).split())}"
    warnings.warn(f"COCO tokenisation approximated in pure Python ({why}); scores may differ slightly from the "
                  "toolkit's", stacklevel=2)
    return Tokenized({k: [approximate_ptb(c) for c in v] for k, v in captions.items()}, True,
                     f"approximate PTB in pure Python (skiplab.interop.coco_eval.approximate_ptb): {why}")


def _ptb(captions: Mapping[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    # one caption a line: any line break inside one (the toolkit replaces only \n) becomes a space
    lines = {k: [{"caption": " ".join(c.splitlines())} for c in v] for k, v in captions.items() if v}
    out = PTBTokenizer().tokenize(lines) if lines else {}
    result = {k: out.get(k, []) for k in captions}
    short = [k for k in captions if len(result[k]) != len(captions[k])]
    if short:  # the toolkit zips ids with java's output lines: fewer lines (java failed) lose captions silently
        k = short[0]
        raise RuntimeError(f"java's output held {len(result[k])} lines for the {len(captions[k])} captions of "
                           f"id {k!r}")
    return result


_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_UNICODE = {"\u2026": " ... ", "\u2014": " -- ", "\u2013": " -- ", "\u201c": '"', "\u201d": '"', "\u2018": "'",
            "\u2019": "'", "\u00a0": " ", "&amp;": "&"}
# words PTB keeps with their final period (a part of PTBLexer's list: titles, months, common abbreviations)
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof gen gov sen rep rev sgt capt col lt mt ft ave blvd rd co corp inc ltd bros vs etc "
    "fig no jan feb mar apr jun jul aug sep sept oct nov dec".split())
_WORDS = {"gonna": ["gon", "na"], "wanna": ["wan", "na"], "gotta": ["got", "ta"], "cannot": ["can", "not"],
          "gimme": ["gim", "me"], "lemme": ["lem", "me"], "'tis": ["'t", "is"], "'twas": ["'t", "was"]}
_KEEP_APOSTROPHE = re.compile(r"'(n'|cause|em|\d0s|s|re|ve|ll|d|m)")  # a leading ' that is part of the token
_WHOLE = re.compile(r"[a-z][a-z0-9+.-]*://\S+|[^@\s]+@[^@\s]+\.[a-z]+")  # a URL or e-mail address: one token
_ACRONYM = re.compile(r"[a-z](\.[a-z])+")  # u.s, p.m, e.g: PTB keeps the final period


def approximate_ptb(caption: str) -> str:
    """One caption tokenised as PTBTokenizer ``-lowerCase`` and pycocoevalcap's filter would, in pure Python (the
    module docstring says what it covers); tokens joined by single spaces."""
    text = caption.lower()
    for a, b in _UNICODE.items():
        text = text.replace(a, b)
    tokens: list[str] = []
    for chunk in text.split():
        if _WHOLE.fullmatch(chunk):
            tokens.append(chunk)
            continue
        chunk = re.sub(r"[()\[\]{}]", lambda m: f" {_BRACKETS[m.group()]} ", chunk)
        chunk = re.sub(r'["`]+', " ", chunk)  # PTB's `` and '' (dropped)
        chunk = re.sub(r"\.{2,}", " ... ", chunk)
        chunk = re.sub(r"--+", " -- ", chunk)
        chunk = re.sub(r"[!?]+", lambda m: f" {m.group()} ", chunk)  # a run is one token
        chunk = re.sub(r"(?<!\d)[,;:]|[,;:](?!\d)", lambda m: f" {m.group()} ", chunk)  # 1,000 and 12:30 stay
        chunk = re.sub(r"[%$&]", lambda m: f" {m.group()} ", chunk)
        for piece in chunk.split():
            tokens.extend([piece] if piece in _BRACKETS.values() else _split_word(piece))
    return " ".join(t for t in tokens if t not in PUNCTUATIONS)


def _split_word(word: str) -> list[str]:
    """A chunk without spaces as PTB splits it: punctuation peeled off both ends, then the clitics."""
    head: list[str] = []
    tail: list[str] = []  # split off the end, last first
    while True:
        if word in _WORDS:
            return head + _WORDS[word] + tail[::-1]
        if len(word) > 1 and (word[0] in ".,;:" or word[0] == "'" and not _KEEP_APOSTROPHE.fullmatch(word)):
            head.append(word[0])
            word = word[1:]
            continue
        lead = re.match(r"-+(?=[^\d.-])", word)  # -a -> - a, but -5 stays
        if lead and len(word) > lead.end():
            head.append(lead.group())
            word = word[lead.end():]
            continue
        trail = re.search(r"(?<=[^-])-+$", word)
        if trail:
            tail.append(trail.group())
            word = word[:trail.start()]
            continue
        if len(word) > 1 and word[-1] in ",;:/":  # w/ -> w /
            tail.append(word[-1])
            word = word[:-1]
            continue
        if len(word) > 1 and word[-1] == "'" and not word.endswith("n'"):  # dogs' -> dogs ', 'n' stays
            tail.append("'")
            word = word[:-1]
            continue
        if len(word) > 1 and word[-1] == "." and not (_ACRONYM.fullmatch(word[:-1]) or word[:-1] in _ABBREVIATIONS):
            tail.append(".")
            word = word[:-1]
            continue
        clitic = re.search(r"(?<=[a-z])n't$|(?<=\w)'(s|re|ve|ll|d|m)$", word)
        if clitic:
            tail.append(clitic.group())
            word = word[:clitic.start()]
            continue
        return head + ([word] if word else []) + tail[::-1]


# -- checks -------------------------------------------------------------------------------------------
def _check_captions(captions: Any, name: str) -> None:
    if not isinstance(captions, Mapping):
        raise ValueError(f"{name}: expected a dict of id -> list of captions, got {type(captions).__name__}")
    for k, v in captions.items():
        if isinstance(v, str) or not isinstance(v, Sequence):
            raise ValueError(f"{name}[{k!r}]: expected a list of captions, got {type(v).__name__}")
        for j, c in enumerate(v):
            if not isinstance(c, str):
                raise ValueError(f"{name}[{k!r}][{j}]: a caption must be a string, got {type(c).__name__}")


def _check(references: Any, candidates: Any) -> None:
    """One-line ValueErrors for references and candidates that cannot be scored, naming the id."""
    _check_captions(references, "references")
    if not isinstance(candidates, Mapping):
        raise ValueError(f"candidates: expected a dict of id -> caption, got {type(candidates).__name__}")
    if not candidates:
        raise ValueError("no candidates to score")
    for k, c in candidates.items():
        if k not in references:
            raise ValueError(f"candidate {k!r} has no references")
        if not isinstance(c, str):
            raise ValueError(f"candidates[{k!r}]: a candidate must be one string, got {type(c).__name__}")
    for k, v in references.items():
        if k not in candidates:
            raise ValueError(f"references {k!r} have no candidate: the two dicts must hold the same ids")
        if not v:
            raise ValueError(f"references[{k!r}] is empty: every candidate needs at least one reference")


# -- the metrics --------------------------------------------------------------------------------------
def score(references: Mapping[Hashable, Sequence[str]], candidates: Mapping[Hashable, str],
          metrics: tuple[str, ...] = METRICS) -> dict[str, Any]:
    """The COCO metrics of ``candidates`` (id -> one caption) against ``references`` (id -> its captions), both
    raw text, tokenised here (:func:`tokenize`). ``metrics``: any of BLEU, METEOR, ROUGE_L, CIDEr, SPICE.

    Returns {Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr, SPICE (those asked for): a float, or a string saying why the
    metric could not be computed; "per_image": {metric: {id: float}} for those computed (SPICE: the "All"
    F-score); "tokenizer": how the captions were tokenised (it starts with "approximate" where they were)}."""
    _check(references, candidates)
    names = {m.lower(): m for m in METRICS}
    unknown = [m for m in metrics if m.lower() not in names]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
    wanted = [names[m.lower()] for m in metrics]
    ids = list(candidates)
    with warnings.catch_warnings(record=True) as caught:  # the approximation is said in "tokenizer" (and re-warned)
        warnings.simplefilter("always")
        tokens = tokenize({**{("ref", k): list(references[k]) for k in ids},
                           **{("cand", k): [candidates[k]] for k in ids}})
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=2)
    gts = {k: tokens["ref", k] for k in ids}
    res = {k: tokens["cand", k] for k in ids}
    out: dict[str, Any] = {}
    per_image: dict[str, dict[Hashable, float]] = {}
    for metric in wanted:
        values = _run(metric, gts, res)
        for name, value in values.items():
            if isinstance(value, str):
                out[name] = value
            else:
                out[name], per_image[name] = float(value[0]), dict(zip(ids, map(float, value[1])))
    out["per_image"], out["tokenizer"] = per_image, tokens.tokenizer
    return out


def _run(metric: str, gts: dict, res: dict) -> dict[str, Any]:
    """{name: (corpus value, per-image values in gts's order)} or {name: reason} for one metric."""
    missing = _package_missing()
    if missing:
        return {name: missing for name in (BLEU_NAMES if metric == "BLEU" else (metric,))}
    if metric == "BLEU":
        from pycocoevalcap.bleu.bleu import Bleu

        corpus, images = Bleu(4).compute_score(gts, res, verbose=0)
        return {name: (corpus[n], images[n]) for n, name in enumerate(BLEU_NAMES)}
    if metric == "ROUGE_L":
        from pycocoevalcap.rouge.rouge import Rouge

        return {"ROUGE_L": Rouge().compute_score(gts, res)}
    if metric == "CIDEr":
        if len(gts) < 2:
            return {"CIDEr": "CIDEr-D needs at least two images: with one, every n-gram's idf is log(1/1) = 0 and "
                             "the toolkit gives 0 whatever the captions"}
        from pycocoevalcap.cider.cider import Cider

        return {"CIDEr": Cider().compute_score(gts, res)}
    if metric == "METEOR":
        return {"METEOR": _meteor(gts, res)}
    return {"SPICE": _spice(gts, res)}


def _meteor(gts: dict, res: dict) -> tuple[float, list[float]] | str:
    if _java_missing():
        return "METEOR 1.5 runs in java (pycocoevalcap's meteor-1.5.jar) and there is no java on PATH"
    from pycocoevalcap.meteor.meteor import Meteor

    try:
        meteor = Meteor()
    except OSError as e:
        return f"METEOR 1.5 could not start java: {e}"
    process = meteor.meteor_p
    try:
        value, images = meteor.compute_score(gts, res)
        return float(value), [float(v) for v in images]
    except (OSError, ValueError) as e:  # a dead jar: a broken pipe, or an empty line where a score should be
        process.kill()
        err = " ".join(process.stderr.read().decode(errors="replace").split())[-300:]
        return f"METEOR 1.5 (java) failed: {type(e).__name__}: {e}; java said: {err or 'nothing'}"
    finally:  # the toolkit holds its lock past a failure, and Meteor.__del__ would wait on it for ever
        if meteor.lock.locked():
            meteor.lock.release()
        for close in (process.stdin.close, process.kill, process.wait):
            try:
                close()
            except OSError:
                pass


def _spice(gts: dict, res: dict) -> tuple[float, list[float]] | str:
    import pycocoevalcap.spice as spice_dir

    lib = os.path.join(os.path.dirname(os.path.abspath(spice_dir.__file__)), "lib")
    absent = [j for j in SPICE_JARS if not os.path.exists(os.path.join(lib, j))]
    if absent:
        return (f"SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(absent)} in {lib}), which pycocoevalcap downloads "
                "on first use; they are not there (python -m pycocoevalcap.spice.get_stanford_models, online)")
    if _java_missing():
        return "SPICE runs in java (pycocoevalcap's spice-1.0.jar) and there is no java on PATH"
    import subprocess

    from pycocoevalcap.spice.spice import Spice

    try:
        value, images = Spice().compute_score(gts, res)
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        return f"SPICE (java) failed: {type(e).__name__}: {e}"
    by_id = dict(zip(sorted(gts), images))  # the toolkit returns them in sorted id order
    return float(value), [by_id[k]["All"]["f"] for k in gts]


# -- CIDEr-D with fixed document frequencies (SCST) ---------------------------------------------------
def _ngrams(sentence: str, n: int) -> dict[tuple[str, ...], int]:
    """The counts of a sentence's 1..n-grams (its whitespace tokens), in the toolkit's ``precook`` order."""
    words = sentence.split()
    counts: dict[tuple[str, ...], int] = defaultdict(int)
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            counts[tuple(words[i:i + k])] += 1
    return counts


class CiderD:
    """CIDEr-D (the module docstring) with N and df fixed from ``train_references`` (id -> captions, or a list of
    each image's captions), as self-critical sequence training rewards: every image one document, df(g) the
    number of them with g in a reference. Captions are split on whitespace: give them tokenised, as the
    candidates are (:func:`tokenize`, or a model's word tokens joined by spaces).

    ``reward(candidates, references)`` -> (mean, {id: CIDEr-D}) scores each id's candidate against its own
    references; ``reward.sentence(candidate, refs)`` one."""

    def __init__(self, train_references: Mapping[Hashable, Sequence[str]] | Iterable[Sequence[str]], n: int = 4,
                 sigma: float = 6.0) -> None:
        groups = (train_references if isinstance(train_references, Mapping)
                  else dict(enumerate(train_references)))
        _check_captions(groups, "train_references")
        empty = [k for k, v in groups.items() if not v]
        if empty:
            raise ValueError(f"train_references[{empty[0]!r}] is empty: every image needs at least one reference")
        if not groups:
            raise ValueError("train_references is empty: document frequencies need at least one image")
        self.n, self.sigma = n, sigma
        self.df: dict[tuple[str, ...], int] = defaultdict(int)
        for refs in groups.values():
            for gram in {g for r in refs for g in _ngrams(r, n)}:
                self.df[gram] += 1
        self.df = dict(self.df)
        self.documents = len(groups)
        self.log_documents = math.log(float(self.documents))

    def _vector(self, sentence: str) -> tuple[list[dict[tuple[str, ...], float]], list[float], int]:
        """(tf-idf per n-gram length, their norms, the sentence's length in words)."""
        vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(self.n)]
        norm = [0.0] * self.n
        for gram, tf in _ngrams(sentence, self.n).items():
            value = float(tf) * (self.log_documents - math.log(max(1.0, float(self.df.get(gram, 0)))))
            vec[len(gram) - 1][gram] = value
            norm[len(gram) - 1] += value * value
        return vec, [math.sqrt(x) for x in norm], len(sentence.split())

    def sentence(self, candidate: str, references: Sequence[str]) -> float:
        """CIDEr-D of one tokenised candidate against its tokenised references (at least one)."""
        if not references:
            raise ValueError("CIDEr-D needs at least one reference")
        vec, norm, length = self._vector(candidate)
        total = [0.0] * self.n
        for ref in references:
            vec_r, norm_r, length_r = self._vector(ref)
            penalty = math.exp(-float(length - length_r) ** 2 / (2 * self.sigma ** 2))
            for k in range(self.n):
                dot = sum(min(v, vec_r[k].get(g, 0.0)) * vec_r[k].get(g, 0.0) for g, v in vec[k].items())
                cosine = dot / (norm[k] * norm_r[k]) if norm[k] and norm_r[k] else 0.0
                total[k] += cosine * penalty
        return 10.0 * sum(total) / self.n / len(references)

    def __call__(self, candidates: Mapping[Hashable, str],
                 references: Mapping[Hashable, Sequence[str]]) -> tuple[float, dict[Hashable, float]]:
        _check(references, candidates)
        scores = {k: self.sentence(c, references[k]) for k, c in candidates.items()}
        return sum(scores.values()) / len(scores), scores
