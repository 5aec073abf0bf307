"""The mixing designs' training step with the weighted sum over depth on one buffer (``across.base.depth_sum``,
81eaa07) and, on the same models, with the chain of products it replaced, all interleaved against PreLN (median of
rounds 2-6): ``PYTHONPATH=. python benchmarks/depth_sum_cost.py`` (gpt-small shape at d = 768, 4 layers, 8 x 256
tokens, one thread). docs/results/bench/intel-xeon-avx512-2026-11-28-depth/depth_sum_before_after.txt holds one run.
"""
import copy, time, statistics, torch
torch.set_num_threads(1)
from skiplab.bench.steps import build, lm_step
from skiplab.connections.across import attn_res, mudd, denseformer
def plain(ws, xs):
    like = xs[0]; y = None
    for w, x in zip(ws, xs):
        t = w.to(like.dtype) * x
        y = t if y is None else y + t
    return y
shape=dict(vocab_size=257, d_model=768, heads=12, ffn_dim=3072, layers=4, context=256)
g=torch.Generator().manual_seed(0); tok=torch.randint(0,257,(8,257),generator=g); b=(tok[:,:-1],tok[:,1:])
mods={"PreLN+AttnRes(block=2)":attn_res,"PreLN+AttnRes":attn_res,"PreLN+MUDD":mudd,"PreLN+DenseFormer":denseformer}
steps={"PreLN": lm_step(build("gpt-small(connection=PreLN)",**shape),b)}
def swapped(step, mod):
    def run():
        cur = mod.depth_sum; mod.depth_sum = plain
        try: step()
        finally: mod.depth_sum = cur
    return run
for d,mod in mods.items():
    m=build(f"gpt-small(connection={d})",**shape)
    steps[d]=lm_step(copy.deepcopy(m),b); steps[d+" before"]=swapped(lm_step(copy.deepcopy(m),b), mod)
ts={k:[] for k in steps}
for r in range(6):
    for k,s in steps.items():
        t=time.perf_counter(); s(); ts[k].append(time.perf_counter()-t)
med={k:statistics.median(v[1:]) for k,v in ts.items()}
for k in steps: print(f"{k:30s} {med[k]/med['PreLN']:.3f}x ({med[k]*1e3:.0f} ms)")
