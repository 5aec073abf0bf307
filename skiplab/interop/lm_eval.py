"""A trained skiplab language model inside lm-evaluation-harness (``pip install lm-eval``; imported when used).

    import lm_eval
    from skiplab.interop.lm_eval import harness_model
    lm = harness_model("runs/lm-2rskip")                  # a run directory or checkpoint (or harness_lm(model, tok))
    lm_eval.simple_evaluate(model=lm, tasks=["wikitext", "hellaswag"])

The adapter subclasses ``lm_eval.api.model.LM``. Text is tokenised by the run's tokenizer with nothing added,
and every text is read after one end-of-text token (EOT), as a document follows one in training; inputs longer
than the model's context are cut from the left.

- ``loglikelihood(context, continuation)``: (Σ log p(c_i | EOT, context, c_<i), every c_i the argmax). The pair
  is split as lm-eval's ``TemplateLM._encode_pair`` splits it: the context's trailing whitespace moved to the
  continuation, context + continuation encoded whole, the continuation's tokens those past the context's own.
- ``loglikelihood_rolling(text)``: Σ log p of every token of the text, EOT the first one's context, in the
  windows of ``lm_eval.utils.get_rolling_token_windows`` (context_len 1, made disjoint), as lm-eval's
  Hugging Face model scores them; the wikitext task's word_perplexity is exp(−Σ / Σ words) over these.
- ``generate_until(context, gen_kwargs)``: greedy (``do_sample`` with ``temperature``, ``top_k``, ``top_p``
  samples), at most ``max_gen_toks`` tokens and the model's context, through the key/value cache
  (:func:`skiplab.models.generate.generate`); it stops at EOT or once the text holds one of ``until``, and
  the text is cut before the first of them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import run_dir
from ..models import model_from_checkpoint
from ..models.generate import generate
from ..tokenization.lm import load_lm_tokenizer


def harness_lm(model: nn.Module, tokenizer: Any, batch_size: int = 16, max_gen_toks: int = 256, seed: int = 0,
               device: str | torch.device = "cpu") -> Any:
    """An ``lm_eval.api.model.LM`` over ``model`` (a skiplab ``GPT``) and its ``tokenizer`` (an LM tokenizer
    with ``encode``, ``decode``, ``eot``)."""
    return _adapter_class()(model, tokenizer, batch_size, max_gen_toks, seed, device)


def harness_model(path: str | Path, average: int = 0, **options: Any) -> Any:
    """:func:`harness_lm` over a trained run (its ``last.pt``, a checkpoint file, or with ``average`` > 1 the
    mean of its last step checkpoints)."""
    ckpt = (run_dir.average_checkpoints(path, average, kind="lm")[0] if average > 1
            else run_dir.load_checkpoint(path, kind="lm"))
    if not ckpt.get("tokenizer"):
        raise ValueError(f"{path}: the run was trained on token files and holds no tokenizer to read text with")
    return harness_lm(model_from_checkpoint(ckpt, path).eval(), load_lm_tokenizer(ckpt["tokenizer"]), **options)


@functools.cache
def _adapter_class() -> type:
    try:
        from lm_eval.api.model import LM
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    except ImportError:
        raise ImportError("lm-evaluation-harness is not installed: pip install lm-eval") from None

    class SkiplabLM(LM):
        """lm-evaluation-harness's three requests over a skiplab language model (the module docstring)."""

        def __init__(self, model: nn.Module, tokenizer: Any, batch_size: int, max_gen_toks: int, seed: int,
                     device: str | torch.device) -> None:
            super().__init__()
            self.model, self.tok = model.to(device).eval(), tokenizer
            self.context, self.eot = model.cfg.context, tokenizer.eot
            self.batch_size, self.max_gen_toks, self.seed = batch_size, max_gen_toks, seed

        def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
            """(EOT + context tokens, continuation tokens), split as ``TemplateLM._encode_pair`` splits them."""
            spaces = len(context) - len(context.rstrip())
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            whole, head = self.tok.encode(context + continuation), self.tok.encode(context)
            return [self.eot] + head, whole[len(head):]

        @torch.no_grad()
        def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
            """(Σ log p of ``cont``, greedy) of each (context tokens, cont tokens), the context cut from the left."""
            rows = []
            for ctx, cont in pairs:
                if not cont:
                    raise ValueError("an empty continuation: nothing to score")
                if len(cont) > self.context:
                    raise ValueError(f"a continuation of {len(cont)} tokens is longer than the model's context "
                                     f"({self.context})")
                rows.append((ctx + cont)[-(self.context + 1):])
            out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
            order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # like lengths share a batch
            device = next(self.model.parameters()).device
            for b in range(0, len(order), self.batch_size):
                part = order[b : b + self.batch_size]
                width = len(rows[part[0]]) - 1
                x = torch.zeros(len(part), width, dtype=torch.long)
                for r, i in enumerate(part):  # right-padded: a causal model's earlier positions do not see it
                    x[r, : len(rows[i]) - 1] = torch.tensor(rows[i][:-1])
                log_p = self.model(x.to(device)).float().log_softmax(-1).cpu()  # (B, T, V)
                for r, i in enumerate(part):
                    n, k = len(rows[i]) - 1, len(pairs[i][1])
                    target = torch.tensor(rows[i][-k:])
                    lp = log_p[r, n - k : n]  # (k, V): the positions predicting the continuation
                    total = float(lp.gather(1, target[:, None]).double().sum())
                    out[i] = (total, bool((lp.argmax(-1) == target).all()))
            return out

        def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
            results = self.score([self.encode_pair(*r.args) for r in requests])
            for r, result in zip(requests, results):
                self.cache_hook.add_partial("loglikelihood", r.args, result)
            return results

        def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
            totals = []
            for r in requests:
                (text,) = r.args
                windows = [make_disjoint_window(w) for w in
                           get_rolling_token_windows(self.tok.encode(text), self.eot, self.context, 1)]
                totals.append(sum(lp for lp, _ in self.score(windows)))
                self.cache_hook.add_partial("loglikelihood_rolling", r.args, totals[-1])
            return totals

        def generate_until(self, requests: list[Any]) -> list[str]:
            gen = torch.Generator().manual_seed(self.seed)
            texts = []
            for r in requests:
                context, kwargs = r.args
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                sample = bool(kwargs.get("do_sample", False))
                max_new = min(int(kwargs.get("max_gen_toks", self.max_gen_toks)), self.context - 1)
                prompt = ([self.eot] + self.tok.encode(context))[-(self.context - max_new):]

                def stop(tokens: list[int]) -> bool:
                    text = self.tok.decode(tokens)
                    return any(u in text for u in until)

                new = generate(self.model, prompt, max_new, self.eot,
                               float(kwargs.get("temperature", 1.0)) if sample else 0.0,
                               int(kwargs.get("top_k", 0) or 0), float(kwargs.get("top_p", 1.0) or 1.0), gen,
                               stop=stop if until else None, vocab=self.tok.vocab_size)
                text = self.tok.decode(new)
                cut = min((text.find(u) for u in until if u in text), default=len(text))
                texts.append(text[:cut])
                self.cache_hook.add_partial("generate_until", r.args, texts[-1])
            return texts

    return SkiplabLM
