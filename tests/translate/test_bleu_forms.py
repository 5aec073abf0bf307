"""BLEU in both forms: tokenised (multi-bleu.perl style) and detokenised sacrebleu, by hand and against each other."""

import math

import pytest

from skiplab.tokenization import moses
from skiplab.translate import bleu, bleu_forms, bleu_tok, paired_bootstrap, score_forms

# Moses-tokenised German, entities already unescaped (as load_corpus gives a WMT'14 reference)
REF = "Der große Hund bellt laut , die kleine Katze schläft tief ."
HYP = "Der große Hund bellt laut,die kleine Katze schläft tief ."  # one token where the reference has three


def test_identical_tokenised_text_scores_100_with_its_signature():
    refs = ['Er sagte : " Hallo , Welt ! "', "Tom 's Haus ist groß ."]
    score, signature = bleu_tok(refs, refs, "moses-tokenised refs")
    assert score == pytest.approx(100.0)
    assert "tok:none(moses-tokenised refs)" in signature and "case:mixed" in signature
    assert "smooth:none" in signature and "nrefs:1" in signature
    assert bleu_tok(refs, refs)[1].count("tok:none|") == 1  # no note, sacrebleu's own field


def test_tokenised_bleu_takes_tokenised_text_without_warning(caplog):
    refs = [f"Der Hund Nummer {i} bellt ." for i in range(120)]  # sacrebleu warns at 100 lines ending " ."
    with caplog.at_level("WARNING", logger="sacrebleu"):
        assert bleu_tok(refs, refs)[0] == pytest.approx(100.0)
    assert not caplog.records
    with caplog.at_level("WARNING", logger="sacrebleu"):  # the detokenised form still warns, rightly
        bleu(refs, refs)
    assert any("tokenized period" in r.getMessage() for r in caplog.records)


def test_tokenised_bleu_by_hand():
    # Tokens: hyp 10, ref 12. Matching n-grams over all: 1-grams 9/10, 2-grams 7/9, 3-grams 5/8, 4-grams 3/7
    # ("laut,die" matches nothing and breaks every n-gram through it). BP = exp(1 - 12/10).
    score, _ = bleu_tok([HYP], [REF])
    assert score == pytest.approx(100 * math.exp(-0.2) * (9 / 10 * 7 / 9 * 5 / 8 * 3 / 7) ** 0.25, abs=1e-9)


def test_tokenised_bleu_is_case_sensitive_and_unsmoothed():
    assert bleu_tok(["der Hund bellt laut ."], ["Der Hund bellt laut ."])[0] == pytest.approx(
        100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25)
    # No 4-gram in common: multi-bleu.perl gives 0; sacrebleu's exp smoothing would not.
    hyp, ref = ["a b c x d e f"], ["a b c y d e f"]
    assert bleu_tok(hyp, ref)[0] == 0.0 and bleu(hyp, ref)[0] > 0


def test_forms_of_a_tokenised_corpus_and_where_tokenisation_matters():
    forms = bleu_forms([HYP], [REF], tokenized=True, lang="de")
    assert forms.tokenized == ([HYP], [REF]) and forms.tokenization == "moses-tokenised refs"
    assert forms.detokenizer == "sacremoses MosesDetokenizer(de)"
    assert forms.detok_refs == ["Der große Hund bellt laut, die kleine Katze schläft tief."]
    assert forms.detok_hyps == ["Der große Hund bellt laut,die kleine Katze schläft tief."]
    scores = score_forms(forms)
    # 13a splits the comma off again, so the detokenised hypothesis matches the reference entirely
    assert scores["bleu"] == pytest.approx(100.0) and scores["bleu_tok"] == pytest.approx(bleu_tok([HYP], [REF])[0])
    assert scores["bleu_tok"] < 60
    assert "tok:13a" in scores["bleu_signature"] and "tok:none(moses-tokenised refs)" in scores["bleu_tok_signature"]
    assert scores["detokenizer"] == forms.detokenizer and "case:lc" in scores["bleu_lowercase_signature"]
    assert set(scores) == {"bleu", "bleu_signature", "bleu_lowercase", "bleu_lowercase_signature", "chrf",
                           "chrf_signature", "bleu_tok", "bleu_tok_signature", "detokenizer"}


def test_forms_of_a_raw_corpus_tokenise_both_sides():
    hyps, refs = ['Er sagte: "Hallo!"', "Ein Hund."], ['Er sagte: "Hallo, Welt!"', "Ein Hund."]
    forms = bleu_forms(hyps, refs, tokenized=False, lang="de")
    assert forms.detokenized == (hyps, refs) and forms.detokenizer is None
    assert forms.tok_hyps == ['Er sagte : " Hallo ! "', "Ein Hund ."]
    assert forms.tok_refs == ['Er sagte : " Hallo , Welt ! "', "Ein Hund ."]
    scores = score_forms(forms)
    assert scores["bleu_tok_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none(sacremoses MosesTokenizer(de))|")
    assert scores["bleu"] == pytest.approx(bleu(hyps, refs)[0]) and scores["detokenizer"] is None


def test_escaped_quotes_reach_the_scores_as_quotes():
    # A WMT'14 line as published, read unescaped; a system that outputs the same tokens scores 100 both ways.
    ref = moses.unescape("Er sagte : &quot; Es ist Tom &apos;s Haus &quot; .")
    forms = bleu_forms([ref], [ref], tokenized=True, lang="de")
    assert forms.detok_refs == ['Er sagte: "Es ist Tom \'s Haus".']
    scores = score_forms(forms)
    assert scores["bleu"] == pytest.approx(100.0) and scores["bleu_tok"] == pytest.approx(100.0)


def test_bootstrap_on_either_form():
    refs = [REF, "Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee ."] * 5
    good = bleu_forms(list(refs), refs, tokenized=True, lang="de")
    bad = bleu_forms([" ".join(reversed(r.split())) for r in refs], refs, tokenized=True, lang="de")
    tok = paired_bootstrap(good.tok_refs, good.tok_hyps, bad.tok_hyps, n_samples=100, metric="bleu_tok")
    detok = paired_bootstrap(good.detok_refs, good.detok_hyps, bad.detok_hyps, n_samples=100)
    assert tok["a"] == pytest.approx(100.0) and tok["b"] == pytest.approx(bleu_tok(bad.tok_hyps, refs)[0])
    assert detok["b"] == pytest.approx(bleu(bad.detok_hyps, good.detok_refs)[0])
    assert tok["better"] == detok["better"] == "a" and "tok:none" in tok["signature"]


def test_forms_need_aligned_lines():
    with pytest.raises(ValueError, match="refs=1.*hyps=2"):
        bleu_forms(["a", "b"], ["a"], tokenized=True, lang="de")
