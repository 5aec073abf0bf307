"""Sampling text from a decoder-only model, one position a step through its key/value cache.

The prompt but its last token is fed at once (``model.start``, filling every layer's cache), then its last
token and each new one alone (``model.step``; :mod:`skiplab.models.incremental`), so a step costs one
position's computation rather than the whole prefix's. The next token is drawn from

    p = softmax(logits / T), restricted to the ``top_k`` most likely tokens and to the smallest set whose
    probabilities reach ``top_p`` (nucleus sampling, Holtzman et al. 2020), renormalised;

``temperature`` 0 takes the most likely token (greedy). With ``vocab`` (the tokenizer's size) below the model's
output, the ids past it are never drawn: a model whose vocabulary is padded past its tokenizer's (as many imported
ones are) has rows no text maps to. Generation stops at ``max_new`` tokens, at the
end-of-text token, or where ``stop`` (a function of the tokens so far, e.g. a stop string in their text) says.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``logits`` (..., V) with every token outside the top-k and the top-p nucleus set to −inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each
        drop = before >= top_p  # the nucleus: tokens until the mass reaches top_p (the first always kept)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


@torch.no_grad()
def generate(model: nn.Module, prompt: list[int], max_new: int, eot: int | None = None, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
             cache: bool = True, stop: Callable[[list[int]], bool] | None = None,
             vocab: int | None = None) -> list[int]:
    """The tokens sampled after ``prompt`` (at most ``max_new``; ``eot`` ends early and is not returned).
    ``cache`` false recomputes the whole prefix at every step (the reference the cache is measured against);
    ``vocab``: draw only ids below it (the tokenizer's vocabulary, where the model's output is padded past it)."""
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (the end-of-text token starts a document)")
    if not (math.isfinite(temperature) and temperature >= 0 and 0 < top_p <= 1 and top_k >= 0):
        raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {temperature}, {top_p}, {top_k}")
    context = model.cfg.context
    if len(prompt) + max_new > context:
        raise ValueError(f"a prompt of {len(prompt)} tokens and {max_new} new ones are more than the model's "
                         f"context ({context})")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if cache:
        state = model.start(torch.tensor([prompt[:-1]], dtype=torch.long, device=device))
        log_probs = model.step(torch.tensor(prompt[-1:], device=device), state)[0]
    else:
        log_probs = model(torch.tensor([prompt], device=device))[0, -1].float().log_softmax(-1)
    out: list[int] = []
    for _ in range(max_new):
        if vocab is not None and vocab < log_probs.shape[-1]:
            log_probs = log_probs.clone()
            log_probs[vocab:] = float("-inf")
        if temperature == 0:
            token = int(log_probs.argmax())
        else:
            # shifted to a maximum of 0 first: a temperature as small as 1e-40 sent every log-probability to -inf
            # (NaN probabilities) where the likeliest token must keep its place
            probs = filter_logits((log_probs - log_probs.max()) / temperature, top_k, top_p).softmax(-1)
            token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
        if token == eot:
            break
        out.append(token)
        if len(out) == max_new or (stop is not None and stop(out)):
            break
        if cache:
            log_probs = model.step(torch.tensor([token], device=device), state)[0]
        else:
            log_probs = model(torch.tensor([prompt + out], device=device))[0, -1].float().log_softmax(-1)
    model.train(was_training)
    return out
