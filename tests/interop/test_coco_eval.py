"""The COCO caption metrics (skiplab.interop.coco_eval) on a small hand-made example: the wrapper's numbers equal
pycocoevalcap's own scorers on PTB-tokenised input, BLEU-1 equals a hand computation, a perfect candidate gets
ROUGE-L 1, the pure-Python tokenizer gives PTBTokenizer's tokens, METEOR and SPICE are numbers or reasons (never
a silent zero), bad input is a one-line ValueError naming the id, and CIDEr-D with fixed document frequencies
equals the toolkit's Cider when they come from the references scored."""

import shutil
import sys

import pytest

from skiplab.interop import coco_eval
from skiplab.interop.coco_eval import CiderD, approximate_ptb, score, tokenize

pycocoevalcap = pytest.importorskip("pycocoevalcap")
CHECKED_AGAINST = "pycocoevalcap 1.2"  # the dev extra's pin
JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not JAVA, reason="no java on PATH: the toolkit's PTBTokenizer and METEOR need it")

# 4 images, 2 to 5 references each, raw text with the capitals and punctuation the tokenizer handles
REFS = {
    "surf": ["A man riding a wave on top of a surfboard.", "A surfer rides a large wave in the ocean.",
             "A person on a surfboard riding a wave!"],
    "dogs": ["Two dogs playing in the snow.", "A pair of dogs run through the snow, chasing each other.",
             "Dogs (two of them) play in the white snow."],
    "tennis": ["A women's tennis player swinging her racket at the ball.", "A woman hits a tennis ball with a racket.",
               "A tennis player about to hit the ball; she's focused.", "A female tennis player in white, on a court.",
               "The woman isn't missing the ball -- she's a pro."],
    "plate": ["There is a plate of food with broccoli and carrots.", "A plate with broccoli, carrots and rice..."],
}
CANDS = {"surf": "A man riding a wave on a surfboard.", "dogs": "Two dogs are running in the snow",
         "tennis": "A woman playing tennis on a court.", "plate": "A plate of food with broccoli."}
NUMBERS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


@pytest.fixture(scope="module")
def toolkit():
    """pycocoevalcap run directly, as its COCOEvalCap.evaluate runs it: PTB-tokenised references and candidates."""
    if not JAVA:
        pytest.skip("no java on PATH")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    gts = PTBTokenizer().tokenize({k: [{"caption": c} for c in v] for k, v in REFS.items()})
    res = PTBTokenizer().tokenize({k: [{"caption": c}] for k, c in CANDS.items()})
    out, per = {}, {}
    bleu, bleus = Bleu(4).compute_score(gts, res, verbose=0)
    for n in range(4):
        out[f"Bleu_{n + 1}"], per[f"Bleu_{n + 1}"] = bleu[n], bleus[n]
    meteor = Meteor()
    for name, scorer in (("METEOR", meteor), ("ROUGE_L", Rouge()), ("CIDEr", Cider())):
        out[name], per[name] = scorer.compute_score(gts, res)
    del meteor
    return dict(gts=gts, res=res, scores=out, per_image={m: dict(zip(gts, map(float, v))) for m, v in per.items()})


@pytest.fixture(scope="module")
def wrapped():
    return score(REFS, CANDS)


@needs_java
def test_numbers_equal_the_toolkits(wrapped, toolkit):
    assert wrapped["tokenizer"] == coco_eval.PTB
    for name in NUMBERS:
        assert isinstance(wrapped[name], float) and wrapped[name] == toolkit["scores"][name], name
        assert wrapped["per_image"][name] == toolkit["per_image"][name], name
    assert 0 < wrapped["CIDEr"] < 10 and 0 < wrapped["METEOR"] < 1
    # METEOR's corpus number is the jar's score of the summed statistics, not the mean of the images' scores
    assert wrapped["METEOR"] != pytest.approx(sum(wrapped["per_image"]["METEOR"].values()) / len(CANDS), abs=1e-6)


@needs_java
def test_tokenize_is_ptb(toolkit):
    tokens = tokenize(REFS)
    assert not tokens.approximate and dict(tokens) == toolkit["gts"]
    assert tokens["dogs"][2] == "dogs -lrb- two of them -rrb- play in the white snow"  # lowercased -LRB- is kept


def test_bleu1_by_hand():
    # refs "a cat sat on the mat" (6 words), "there is a cat on the mat" (7); candidate "the cat the cat on the mat"
    # (7): unigram counts the 3, cat 2, on 1, mat 1, clipped to the most any one reference holds (1 each): 4 of 7.
    # The closest reference length to 7 is 7, so BP = 1 and BLEU-1 = 4/7.
    refs = {0: ["A cat sat on the mat.", "There is a cat on the mat."]}
    assert score(refs, {0: "The cat the cat on the mat."}, ("BLEU",))["Bleu_1"] == pytest.approx(4 / 7, rel=1e-9)
    # candidate "the cat": p_1 = 2/2; the closest reference length to 2 is 6, so BP = exp(1 - 6/2) = e^-2
    assert score(refs, {0: "The cat"}, ("BLEU",))["Bleu_1"] == pytest.approx(2.718281828459045 ** -2, rel=1e-9)


def test_perfect_candidate_rouge_l_is_1():
    perfect = {k: v[1] for k, v in REFS.items()}
    s = score(REFS, perfect, ("ROUGE_L",))
    assert s["ROUGE_L"] == pytest.approx(1.0)
    assert all(v == pytest.approx(1.0) for v in s["per_image"]["ROUGE_L"].values())
    assert set(s) == {"ROUGE_L", "per_image", "tokenizer"}


def test_punctuations_are_the_toolkits():
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

    assert coco_eval.PUNCTUATIONS == tuple(PUNCTUATIONS)


@needs_java
def test_fallback_tokenizer_gives_ptbs_tokens(toolkit):
    for k, refs in REFS.items():
        assert [approximate_ptb(c) for c in refs] == toolkit["gts"][k], k
        assert approximate_ptb(CANDS[k]) == toolkit["res"][k][0], k


def test_without_java_meteor_is_a_reason_and_tokens_approximate(monkeypatch, tmp_path, wrapped):
    if JAVA:
        assert isinstance(wrapped["METEOR"], float)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java to be found
    with pytest.warns(UserWarning, match="approximated"):
        s = score(REFS, CANDS, ("METEOR", "BLEU", "SPICE"))
    assert isinstance(s["METEOR"], str) and "java" in s["METEOR"]
    assert s["tokenizer"].startswith("approximate") and "no java" in s["tokenizer"]
    assert isinstance(s["Bleu_4"], float) and isinstance(s["SPICE"], str)
    with pytest.warns(UserWarning, match="approximated"):
        tokens = tokenize(REFS)
    assert tokens.approximate and tokens["surf"][0] == "a man riding a wave on top of a surfboard"


@needs_java
def test_a_failing_meteor_jar_is_a_reason(monkeypatch):
    import pycocoevalcap.meteor.meteor as meteor

    monkeypatch.setattr(meteor, "METEOR_JAR", "missing.jar")  # java starts and exits at once
    s = score(REFS, CANDS, ("METEOR",))
    assert isinstance(s["METEOR"], str) and "failed" in s["METEOR"] and "missing.jar" in s["METEOR"]


def test_spice_is_a_reason(wrapped):
    assert isinstance(wrapped["SPICE"], str) and "Stanford CoreNLP" in wrapped["SPICE"]
    assert "SPICE" not in wrapped["per_image"]


def test_missing_package_is_a_reason_for_every_metric(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocoevalcap", None)  # import pycocoevalcap raises ImportError
    with pytest.warns(UserWarning, match="approximated"):
        s = score(REFS, CANDS)
    assert all(s[name] == coco_eval.INSTALL for name in NUMBERS + ("SPICE",))
    assert s["per_image"] == {} and "pycocoevalcap is not installed" in s["tokenizer"]


def test_one_image_cider_is_a_reason():
    s = score({"x": REFS["surf"]}, {"x": CANDS["surf"]}, ("CIDEr",))
    assert isinstance(s["CIDEr"], str) and "two images" in s["CIDEr"]


@pytest.mark.parametrize("refs, cands, words", [
    ({**REFS, "cat": ["A cat."]}, CANDS, "references 'cat' have no candidate"),
    (REFS, {**CANDS, "cat": "A cat."}, "candidate 'cat' has no references"),
    ({**REFS, "plate": []}, CANDS, "references['plate'] is empty"),
    ({**REFS, "dogs": "Two dogs."}, CANDS, "references['dogs']: expected a list"),
    ({**REFS, "dogs": ["Two dogs.", None]}, CANDS, "references['dogs'][1]"),
    (REFS, {**CANDS, "surf": ["A man."]}, "candidates['surf']"),
    (REFS, {}, "no candidates"),
])
def test_bad_input_is_a_one_line_error_naming_the_id(refs, cands, words):
    with pytest.raises(ValueError) as e:
        score(refs, cands)
    assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown metric 'BLEURT'"):
        score(REFS, CANDS, ("BLEURT",))


@needs_java
def test_cider_d_with_fixed_df_equals_the_toolkits_cider(toolkit):
    gts, res = toolkit["gts"], toolkit["res"]
    reward = CiderD(gts)  # df from the very references scored: the toolkit's own CIDEr-D
    mean, per = reward({k: v[0] for k, v in res.items()}, gts)
    assert mean == pytest.approx(toolkit["scores"]["CIDEr"], rel=1e-12)
    assert per == pytest.approx(toolkit["per_image"]["CIDEr"], rel=1e-12)
    assert reward.documents == 4 and reward.df[("snow",)] == 1 and reward.df[("a",)] == 4
    # df from a larger training set (SCST's form): N and df change, so the numbers do
    train = {**gts, "cats": ["a cat sitting on a couch"], "snow": ["a man skiing down a snowy hill in the snow"]}
    other = CiderD(train)
    assert other.log_documents == pytest.approx(__import__("math").log(6)) and other.df[("snow",)] == 2
    assert other.sentence(res["dogs"][0], gts["dogs"]) != pytest.approx(per["dogs"])
    assert CiderD(list(gts.values())).sentence(res["dogs"][0], gts["dogs"]) == per["dogs"]
