"""evaluate_split and split_forms on a tiny trained model (tests/fixtures) and test-written WMT'14 / Multi30k files."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from skiplab.corpora import load_corpus, read_lines
from skiplab.tokenization import moses
from skiplab.translate import bleu_forms, score_forms
from skiplab.translate.translator import Translator, evaluate_split, split_forms

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

pytestmark = pytest.mark.usefixtures("offline")  # off ~/.cache, $SKIPLAB_DATA and the network

# Moses-tokenised, escaped, as the Stanford NMT group publishes newstest2012-2014
WMT_EN = ["A man &apos;s bike is red .", "Two dogs play in the snow .", "He said &quot; hello &quot; .",
          "A woman &amp; a child .", "The cat sleeps ."]
WMT_DE = ["Das Fahrrad eines Mannes ist rot .", "Zwei Hunde spielen im Schnee .", "Er sagte &quot; hallo &quot; .",
          "Eine Frau &amp; ein Kind .", "Die Katze schläft ."]
M30K_EN = ["A man rides a bike.", 'He said "hello".', "Two dogs play."]
M30K_DE = ["Ein Mann fährt Fahrrad.", 'Er sagte "hallo".', "Zwei Hunde spielen."]


def write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def run_on(tmp_path: Path, corpus: str) -> Path:
    """The fixture's tiny en-de Transformer (3 updates on Multi30k), as a run whose config names ``corpus``."""
    ckpt = torch.load(FIXTURES / "transformer_pre_shell.pt", weights_only=True)
    ckpt["config"]["corpus"] = corpus
    run = tmp_path / "run"
    run.mkdir()
    torch.save(ckpt, run / "last.pt")
    return run


@pytest.fixture
def wmt14(tmp_path) -> Path:
    root = tmp_path / "wmt14"
    root.mkdir()
    for i, stem in enumerate(("train", "newstest2012", "newstest2013", "newstest2014")):
        write(root / f"{stem}.en", WMT_EN[i:] if stem != "newstest2012" else WMT_EN[:2])
        write(root / f"{stem}.de", WMT_DE[i:] if stem != "newstest2012" else WMT_DE[:2])
    return root


@pytest.fixture
def multi30k(tmp_path) -> Path:
    root = tmp_path / "m30k"
    root.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        write(root / f"{stem}.en", M30K_EN)
        write(root / f"{stem}.de", M30K_DE)
    return root


def test_evaluate_split_on_wmt14_reports_both_bleu_forms(tmp_path, wmt14):
    run = run_on(tmp_path, "wmt14-en-de(valid=newstest2012+newstest2013)")
    result = evaluate_split(run, "valid", beam=1, data_dir=str(wmt14), device="cpu", progress=False)
    assert result["split"] == "wmt14-en-de(valid=newstest2012+newstest2013)/valid.en-de"
    assert result["sentences"] == 2 + 3  # newstest2012 then newstest2013
    hyps = read_lines(result["hypotheses"])  # the model's output, as it came
    assert Path(result["hypotheses"]).name == "valid.beam1.hyp" and len(hyps) == 5
    refs = [moses.unescape(line) for line in WMT_DE[:2] + WMT_DE[2:]]
    expected = score_forms(bleu_forms(hyps, refs, tokenized=True, lang="de"))
    for key, value in expected.items():
        assert result[key] == pytest.approx(value) if isinstance(value, float) else result[key] == value
    assert result["detokenizer"] == "sacremoses MosesDetokenizer(de)"
    assert "tok:13a" in result["bleu_signature"] and "tok:none(moses-tokenised refs)" in result["bleu_tok_signature"]
    assert 0 <= result["bleu_tok"] <= 100 and 0 <= result["bleu"] <= 100
    detok = moses.detokenize(hyps, "de")
    if detok == hyps:
        assert result["hypotheses_detok"] is None
    else:
        assert read_lines(result["hypotheses_detok"]) == detok


def perfect(data_dir: Path, corpus: str, split: str):
    """A Translator.translate that returns each source line's reference, as load_corpus reads it (a source
    line it was not given unescaped is a KeyError)."""
    data = load_corpus(corpus, data_dir, "en", "de", split, download=False)
    table = dict(zip(data.src, data.tgt))
    return lambda self, lines, **kw: [table[line] for line in lines]


def test_a_perfect_system_on_wmt14_scores_100_in_both_forms_and_gets_a_detokenised_file(tmp_path, wmt14,
                                                                                         monkeypatch):
    run = run_on(tmp_path, "wmt14-en-de")
    monkeypatch.setattr(Translator, "translate", perfect(wmt14, "wmt14-en-de", "test"))
    result = evaluate_split(run, "test", beam=1, data_dir=str(wmt14), device="cpu", progress=False)
    assert result["split"] == "wmt14-en-de/test.en-de" and result["sentences"] == 2  # newstest2014
    assert result["bleu"] == pytest.approx(100.0) and result["bleu_tok"] == pytest.approx(100.0)
    assert read_lines(result["hypotheses"]) == ["Eine Frau & ein Kind .", "Die Katze schläft ."]  # unescaped
    assert read_lines(result["hypotheses_detok"]) == ["Eine Frau & ein Kind.", "Die Katze schläft."]
    assert Path(result["hypotheses_detok"]).name == "test.beam1.detok.hyp"


def test_a_raw_corpus_is_moses_tokenised_for_tokenised_bleu(tmp_path, multi30k, monkeypatch):
    run = run_on(tmp_path, "multi30k")
    system = ["Ein Mann fährt Rad.", 'Er sagte "hallo".', "Zwei Hunde spielen."]
    monkeypatch.setattr(Translator, "translate", lambda self, lines, **kw: system)
    result = evaluate_split(run, "test", beam=1, data_dir=str(multi30k), device="cpu", progress=False)
    assert result["detokenizer"] is None and result["hypotheses_detok"] is None
    assert "tok:none(sacremoses MosesTokenizer(de))" in result["bleu_tok_signature"]
    # tokenised with sacremoses on both sides: "Ein Mann fährt Rad ." against "Ein Mann fährt Fahrrad ."
    forms = split_forms({"corpus": "multi30k", "data_dir": str(multi30k), "src": "en", "tgt": "de"}, "test", system)
    assert forms.tok_hyps[0] == "Ein Mann fährt Rad ." and forms.detok_refs == M30K_DE
    assert result["bleu_tok"] == pytest.approx(score_forms(forms)["bleu_tok"])
    assert result["bleu"] == pytest.approx(score_forms(forms)["bleu"])


def test_split_forms_reads_the_run_config_and_the_data_dir_override(tmp_path, wmt14):
    config = torch.load(FIXTURES / "transformer_pre_shell.pt", weights_only=True)["config"]
    config = {**config, "corpus": "wmt14-en-de"}
    hyps = ['Das Fahrrad " eines " Mannes .', "Er sagte hallo .", "Eine Frau ."]  # newstest2013 has 3 lines
    forms = split_forms(config, "valid", hyps, data_dir=str(wmt14))
    assert forms.tok_refs == [moses.unescape(x) for x in WMT_DE[2:]]
    assert forms.detok_hyps[0] == 'Das Fahrrad "eines" Mannes.' and forms.tok_hyps == hyps
    with pytest.raises(ValueError, match="refs=3.*hyps=2"):
        split_forms(config, "valid", hyps[:2], data_dir=str(wmt14))


def test_evaluations_with_other_checkpoints_or_alpha_keep_their_own_files_and_a_report(tmp_path, multi30k):
    """The run's last.pt, a step checkpoint file of it and another length penalty each write their own .hyp and
    .json (the report, with the checkpoint, machine and code version): none replaces another's."""
    run = run_on(tmp_path, "multi30k")
    (run / "checkpoint_3.pt").write_bytes((run / "last.pt").read_bytes())
    common = dict(beam=1, data_dir=str(multi30k), device="cpu", progress=False)
    results = [evaluate_split(run, "test", **common), evaluate_split(run / "checkpoint_3.pt", "test", **common),
               evaluate_split(run / "last.pt", "test", alpha=1.0, **common)]
    names = [Path(r["hypotheses"]).name for r in results]
    assert names == ["test.beam1.hyp", "test.beam1.of-checkpoint_3.hyp", "test.beam1.alpha1.hyp"]
    for result, name in zip(results, names):
        report = json.loads((run / name.replace(".hyp", ".json")).read_text())
        assert report["checkpoint"] == result["checkpoint"] and report["bleu"] == result["bleu"]
        assert report["environment"]["torch"] == torch.__version__ and "git_commit" in report["environment"]
    assert json.loads((run / "test.beam1.alpha1.json").read_text())["alpha"] == 1.0


def test_a_model_whose_stacks_differ_reports_each_stacks_connection(tmp_path):
    ckpt = torch.load(FIXTURES / "transformer_pre_shell.pt", weights_only=True)
    tr = Translator.load(run_on(tmp_path, "multi30k"), device="cpu")
    assert tr.describe()["connection"] == tr.model.cfg.connection  # one design: one name
    tr.model.cfg = dataclasses.replace(tr.model.cfg, encoder_connection="2rSkip+LN", decoder_connection="SAS")
    assert tr.describe()["connection"] == {"encoder": "2rSkip+LN", "decoder": "SAS"}
    assert ckpt["config"]["model"] == tr.describe()["model"]
