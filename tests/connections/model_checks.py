"""A design inside the three model families: a training step whose gradients reach every weight, and, for the
GPT, incremental decoding against the full forward (float32 noise measured against float64, tests/noise.py)."""

import copy

import torch
import torch.nn.functional as F

from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig
from skiplab.models.preact_resnet import PreActResNet, PreActResNetConfig
from tests.noise import assert_within_noise, noise


def tiny_gpt(connection: str, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, d_model=32, heads=4, layers=2, ffn_dim=64, context=16, connection=connection)
    return GPT(GPTConfig(**{**cfg, **kw}))


def tiny_transformer(connection: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=30, d_model=32, heads=4, ffn_dim=64, encoder_layers=2,
                                         decoder_layers=3, dropout=0.0, attention_dropout=0.0, connection=connection))


def tiny_resnet(connection: str) -> PreActResNet:
    torch.manual_seed(0)
    return PreActResNet(PreActResNetConfig(depth=8, connection=connection))


def assert_every_weight_learns(model, loss) -> None:
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def gpt_step_and_incremental_decoding(model: GPT) -> None:
    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    assert_every_weight_learns(model, F.cross_entropy(model(tokens).transpose(1, 2), tokens))
    model.eval()

    @torch.no_grad()
    def both(m):
        full = m(tokens)
        caches = m.new_caches()
        steps = [m(tokens[:, :5], caches)] + [m(tokens[:, t : t + 1], caches) for t in range(5, tokens.shape[1])]
        return full, torch.cat(steps, 1)

    full, cached = both(model)
    full64, cached64 = both(copy.deepcopy(model).double())
    assert_within_noise(cached, full, noise((full, full64), (cached, cached64)))


def transformer_step(model: Transformer) -> None:
    src = torch.randint(3, 30, (2, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(3, 30, (2, 6), generator=torch.Generator().manual_seed(2))
    assert_every_weight_learns(model, F.cross_entropy(model(src, tgt).transpose(1, 2), tgt))


def resnet_step(model: PreActResNet) -> None:
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    assert_every_weight_learns(model, F.cross_entropy(model(images), torch.tensor([3, 7])))
