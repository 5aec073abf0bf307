"""skiplab transformer-small PostLN / torch.nn.Transformer of the same shape, training step, side by side.

Self-contained so that it runs on any commit of skiplab: `PYTHONPATH=<checkout> python benchmarks/transformer_vs_torch.py`
(docs/results/bench/before_after.txt holds its output at 447cef2 and after the stacked QKV / is_causal attention).
"""
import math, statistics, sys, time
import torch
import torch.nn.functional as F
from torch import nn
import skiplab
from skiplab.models import build_model, model_config
from skiplab.models.seq2seq import sinusoid
from skiplab.train.recipe_mt import label_smoothed_loss

class TorchTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=0)
        self.register_buffer("positions", sinusoid(cfg.max_positions, cfg.d_model), persistent=False)
        self.core = nn.Transformer(cfg.d_model, cfg.heads, cfg.encoder_layers, cfg.decoder_layers, cfg.ffn_dim, cfg.dropout, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)
    def e(self, t): return self.drop(self.embed(t) * math.sqrt(self.cfg.d_model) + self.positions[: t.shape[1]])
    def forward(self, src, tgt):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        pad = src == 0
        h = self.core(self.e(src), self.e(tgt), tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return F.linear(h, self.embed.weight)

torch.manual_seed(0)
ours = build_model(model_config("transformer-small(connection=PostLN)", vocab_size=8000, pad_id=0)).train()
ref = TorchTransformer(ours.cfg).train()
g = torch.Generator().manual_seed(0)
src = torch.randint(4, 8000, (128, 30), generator=g); tgt = torch.randint(4, 8000, (128, 30), generator=g)
tin = torch.cat([torch.full((128, 1), 2), tgt[:, :-1]], 1)
def step(m):
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    def f():
        loss, _ = label_smoothed_loss(m(src, tin), tgt, 0.1, 0)
        opt.zero_grad(); loss.backward(); opt.step()
    return f
cases = {"skiplab": step(ours), "torch": step(ref)}
times = {k: [] for k in cases}
for i in range(12):
    for k, f in cases.items():
        t = time.perf_counter(); f()
        if i >= 2: times[k].append(time.perf_counter() - t)
m = {k: statistics.median(v) for k, v in times.items()}
print(f"{skiplab.__file__}: skiplab {m['skiplab']*1e3:.0f} ms, torch {m['torch']*1e3:.0f} ms, ratio {m['skiplab']/m['torch']:.3f}")
