"""Evaluation in the field's units: bits per byte, per-token perplexity and word perplexity share one Σ NLL, and
word perplexity counts words as lm-evaluation-harness does (len(re.split(r"\\s+", doc)) per document)."""

import json
import math

import pytest
import torch
from torch import nn

from skiplab.models import build_model, model_config
from skiplab.tokenization.lm import ByteTokenizer
from skiplab.corpora.windows import count_words
from skiplab.train import lm, lm_data

# 12 + 11 bytes; words by hand: the / cat / sat, and on / the / mat / '' (a trailing newline leaves an empty piece)
DOCS = ["the cat  sat", "on the\nmat\n"]
WORDS, BYTES = 3 + 4, 12 + 11
TARGETS = BYTES + 2 - 1  # every token of the stream (two end-of-text tokens added) but the first


@pytest.fixture
def split(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    where = {"corpus": "", "data_dir": "", "test_file": str(path), "bin_dtype": "uint16", "vocab_size": 257}
    return lm_data.stream(where, "test", ByteTokenizer())


class Uniform(nn.Module):
    """Every token equally likely: each target's NLL is ln V."""

    def __init__(self, vocab: int, context: int):
        super().__init__()
        self.vocab, self.cfg, self.w = vocab, type("Cfg", (), {"context": context}), nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab) + self.w


def units(result):
    """Σ NLL recovered from each unit and its count."""
    return (result["bpb"] * math.log(2) * result["bytes"], math.log(result["token_ppl"]) * result["tokens"],
            math.log(result["word_ppl"]) * result["words"])


def test_words_are_counted_as_lm_eval_counts_them():
    assert count_words(DOCS) == WORDS
    assert count_words([" leading and trailing "]) == 5 and count_words([""]) == 1


def test_word_perplexity_of_known_log_probs(split):
    assert (split.n_bytes, split.n_words) == (BYTES, WORDS)
    result = lm.evaluate(Uniform(257, 64), split, 64, torch.device("cpu"), False)
    nll = TARGETS * math.log(257)
    assert result["tokens"] == TARGETS and result["nll"] == pytest.approx(nll, rel=1e-7)  # float32 log-softmax
    assert result["word_ppl"] == pytest.approx(257 ** (TARGETS / WORDS), rel=1e-6)  # exp(24 ln 257 / 7)
    assert result["token_ppl"] == pytest.approx(257, rel=1e-7)
    assert result["bpb"] == pytest.approx(TARGETS * math.log2(257) / BYTES, rel=1e-7)


@pytest.mark.parametrize("context,stride", [(64, 0), (8, 0), (8, 3)])
def test_the_three_units_share_one_nll_equal_to_a_direct_forward(split, context, stride):
    torch.manual_seed(0)
    model = build_model(model_config(f"gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context={context})",
                                     vocab_size=257)).eval()
    result = lm.evaluate(model, split, context, torch.device("cpu"), False, stride=stride)
    for nll in units(result):
        assert nll == pytest.approx(result["nll"], rel=1e-9)
    if context >= len(split):  # one window: the stream's every target by one full forward
        tokens = torch.from_numpy(split.tokens.astype("int64"))
        with torch.no_grad():
            log_p = model(tokens[None, :-1])[0].double().log_softmax(-1)
        direct = -float(log_p.gather(1, tokens[1:, None]).sum())
        assert result["nll"] == pytest.approx(direct, rel=1e-5)
        assert result["word_ppl"] == pytest.approx(math.exp(direct / WORDS), rel=1e-5)


def test_coverage_states_the_counts(split):
    text = lm.coverage(split, 8, 3)
    assert f"{len(split)} tokens" in text and f"{TARGETS} targets" in text and "each scoring its last 3" in text
