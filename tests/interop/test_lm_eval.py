"""The lm-evaluation-harness adapter (skiplab.interop.lm_eval) on a tiny trained run and local tasks (a YAML and
a JSON Lines file each; nothing downloaded): every log-likelihood equal to one computed with the skiplab model
directly, rolling windows as lm-eval lays them out, word perplexity as its wikitext task defines it, and
generation cut at the stop strings."""

import json
import math
import os
import re
import sys

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from skiplab.interop.lm_eval import harness_model  # noqa: E402
from skiplab.models.generate import generate  # noqa: E402
from skiplab.train.lm import LMTrainConfig, load_run, train  # noqa: E402
from tests.train.test_lm import Padded  # noqa: E402

TINY = "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=32)"
STORY = "the cat sat on the mat. the dog sat on the log. "
MC = [{"question": "the cat sat on the", "choices": ["mat", "log", "dog"], "answer": 0},
      {"question": "the dog sat on", "choices": ["the log", "a cat"], "answer": 0}]
# the second and third are longer than the context (32 tokens): several rolling windows
PAGES = [{"text": "the cat sat."}, {"text": STORY * 2}, {"text": " " + STORY + "\n\nthe end\n"}]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    (root / "train.jsonl").write_text("".join(json.dumps({"text": STORY * k}) + "\n" for k in (1, 2, 3) * 4))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(LMTrainConfig(corpus="", train_file=str(root / "train.jsonl"), valid_file=str(root / "train.jsonl"),
                            model=TINY, batch_size=8, max_steps=30, eval_every=30, warmup=2, lr=1e-2, device="cpu",
                            out=str(root / "run")), progress=False)
    finally:
        torch.set_num_threads(threads)
    _, model, tok = load_run(root / "run")
    return root / "run", model, tok


def task(root, name, rows, **config):
    """A local task: ``rows`` in NAME.jsonl, its YAML beside it."""
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {data}",
             "test_split: test"] + [f"{k}: {json.dumps(v)}" for k, v in config.items()]
    (root / f"{name}.yaml").write_text("\n".join(lines) + "\n")


@torch.no_grad()
def direct(model, tok, context: str, continuation: str) -> tuple[float, bool]:
    """Σ log p(continuation | EOT + context) by one full forward of the skiplab model (texts within its context)."""
    head, tail = tok.encode(context), tok.encode(continuation)
    seq = torch.tensor([tok.eot] + head + tail)
    log_p = model(seq[None, :-1])[0].double().log_softmax(-1)[-len(tail):]
    target = seq[-len(tail):]
    return float(log_p.gather(1, target[:, None]).sum()), bool((log_p.argmax(-1) == target).all())


@torch.no_grad()
def rolling(model, tok, text: str) -> float:
    """Σ log p of every token of ``text`` after EOT: windows of n predictions, the last given a full context."""
    seq, n = [tok.eot] + tok.encode(text), model.cfg.context
    total, p, length = 0.0, 0, len(seq) - 1
    while p < length:
        q = min(p + n, length)  # predict seq[p + 1 : q + 1] from the inputs seq[start : q]
        start = max(0, q - n)
        log_p = model(torch.tensor([seq[start:q]]))[0].double().log_softmax(-1)[p - start :]
        total += float(log_p.gather(1, torch.tensor(seq[p + 1 : q + 1])[:, None]).sum())
        p = q
    return total


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args]


def test_loglikelihoods_equal_the_model_s_own(trained):
    path, model, tok = trained
    lm = harness_model(path, batch_size=3)
    pairs = [(m["question"], " " + c) for m in MC for c in m["choices"]] + [("", "the cat"), ("the cat ", "sat")]
    got = lm.loglikelihood(requests("loglikelihood", pairs))
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        spaces = len(ctx) - len(ctx.rstrip())  # lm-eval moves the context's trailing spaces to the continuation
        want = direct(model, tok, ctx.rstrip(), ctx[len(ctx) - spaces:] + cont)
        assert ll == pytest.approx(want[0], rel=1e-5, abs=1e-5) and greedy == want[1]
    long = (("the dog sat on the log. " * 3).rstrip(), " the mat")  # the context cut to the model's 32 tokens
    seq = [tok.eot] + tok.encode(long[0] + long[1])
    with torch.no_grad():
        log_p = model(torch.tensor([seq[-33:-1]]))[0].double().log_softmax(-1)[-8:]
    want = float(log_p.gather(1, torch.tensor(seq[-8:])[:, None]).sum())
    assert lm.loglikelihood(requests("loglikelihood", [long]))[0][0] == pytest.approx(want, rel=1e-5)
    texts = [p["text"] for p in PAGES]
    for text, ll in zip(texts, lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]))):
        assert ll == pytest.approx(rolling(model, tok, text), rel=1e-5)


def test_tasks_through_simple_evaluate(trained, tmp_path):
    path, model, tok = trained
    lm = harness_model(path)
    prompt = "the cat sat"
    free = tok.decode(generate(model, [tok.eot] + tok.encode(prompt), 20, tok.eot, temperature=0))
    stop = free[len(free) // 2]  # a character the greedy text holds: generation must end at its first occurrence
    task(tmp_path, "tiny_mc", MC, output_type="multiple_choice", doc_to_text="{{question}}",
         doc_to_choice="{{choices}}", doc_to_target="{{answer}}", metric_list=[{"metric": "acc"}])
    task(tmp_path, "tiny_pages", PAGES, output_type="loglikelihood_rolling", doc_to_text="", doc_to_target="{{text}}",
         metric_list=[{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")])
    task(tmp_path, "tiny_gen", [{"question": prompt, "answer": "x"}], output_type="generate_until",
         doc_to_text="{{question}}", doc_to_target="{{answer}}", metric_list=[{"metric": "exact_match"}],
         generation_kwargs={"until": [stop], "max_gen_toks": 20, "do_sample": False})
    out = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc", "tiny_pages", "tiny_gen"], log_samples=True,
                                  task_manager=TaskManager(include_path=str(tmp_path)), bootstrap_iters=0)
    for sample in out["samples"]["tiny_mc"]:
        doc = sample["doc"]
        for choice, resp in zip(doc["choices"], sample["resps"]):
            ll, greedy = resp[0]
            assert ll == pytest.approx(direct(model, tok, doc["question"], " " + choice)[0], rel=1e-5, abs=1e-5)
    texts = [p["text"] for p in PAGES]
    nll = -sum(rolling(model, tok, t) for t in texts)
    words = sum(len(re.split(r"\s+", t)) for t in texts)  # lm-eval's count_words
    assert words == 3 + (24 + 1) + (1 + 12 + 2 + 1)  # a leading or trailing space adds an empty piece
    pages = out["results"]["tiny_pages"]
    assert pages["word_perplexity,none"] == pytest.approx(math.exp(nll / words), rel=1e-5)
    n_bytes = sum(len(t.encode()) for t in texts)
    assert pages["bits_per_byte,none"] == pytest.approx(nll / n_bytes / math.log(2), rel=1e-5)
    (gen,) = out["samples"]["tiny_gen"]
    assert gen["resps"][0][0] == free[: free.index(stop)] and stop not in gen["resps"][0][0]


def test_generation_stops_at_the_stop_strings(trained):
    path, model, tok = trained
    lm = harness_model(path)
    free = tok.decode(generate(model, [tok.eot] + tok.encode("the dog"), 20, tok.eot, temperature=0))
    assert len(free) > 4
    stops = [free[3:5], free[1:2] + "never"]  # the second never matches
    (got,) = lm.generate_until(requests("generate_until", [("the dog", {"until": stops, "max_gen_toks": 20})]))
    assert got == free[: free.index(free[3:5])]
    calls = []
    generate(model, [tok.eot] + tok.encode("the dog"), 20, tok.eot, temperature=0,
             stop=lambda out: calls.append(len(out)) or len(out) == 3)
    assert calls == [1, 2, 3]  # generation ended when stop said so


def test_generation_draws_only_the_tokenizers_ids(trained):
    """A model whose output is padded past its tokenizer's vocabulary, the padding the most likely (an import's
    untrained rows): generate_until writes the tokenizer's ids alone, as the unpadded model does."""
    path, model, tok = trained
    lm = harness_model(path)
    want = lm.generate_until(requests("generate_until", [("the dog", {"until": ["never"], "max_gen_toks": 6})]))
    lm.model = Padded(lm.model)
    got = lm.generate_until(requests("generate_until", [("the dog", {"until": ["never"], "max_gen_toks": 6})]))
    assert got == want and len(got[0]) > 0


def test_without_lm_eval_the_error_names_the_package(trained, monkeypatch):
    from skiplab.interop import lm_eval as adapter

    path, model, tok = trained
    adapter._adapter_class.cache_clear()
    for name in {"lm_eval", *(m for m in sys.modules if m.startswith("lm_eval."))}:
        monkeypatch.setitem(sys.modules, name, None)  # None: an import of it fails, as where it is not installed
    try:
        with pytest.raises(ImportError, match="pip install lm-eval"):
            adapter.harness_lm(model, tok)
    finally:
        adapter._adapter_class.cache_clear()
