"""The output layer and its cross-entropy at GPT-2's head shape (d 768, vocabulary padded to 50,304), float32 on this
machine: the memory one forward and backward adds at its peak (the process's peak resident set above what it held
with the inputs made, each measurement in a fresh process) and the step's time (fastest of ``--repeats`` after the
measured one), the eager head (``F.linear`` then ``F.cross_entropy``) against skiplab's chunked one
(:mod:`skiplab.models.linear_ce`, its default chunk, and each of ``--chunks`` rows a chunk), alternating process
by process. All compute the same numbers (tests/models/test_linear_ce.py); the gradients of h and W are counted in
each.

With ``--model SPEC`` (e.g. ``gpt2-small``) it measures a whole training step of that model instead (AdamW, its
state made before the measurement; ``--rows`` then counts sequences of the model's context): the peak memory above
the weights, gradients and AdamW state, with ``train lm``'s eager head and with ``--head-loss chunked``.

Usage: python benchmarks/head_loss_memory.py [--rows 2048,8192] [--dim 768] [--vocab 50304] [--chunks 32,128]
                                             [--repeats 2] [--threads 2] [--model SPEC] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

def child(impl: str, rows: int, dim: int, vocab: int, chunk: int, repeats: int, threads: int) -> dict:
    import torch

    from skiplab.models.linear_ce import default_chunk, linear_cross_entropy

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, dim, generator=g).requires_grad_()
    w = (0.02 * torch.randn(vocab, dim, generator=g)).requires_grad_()
    y = torch.randint(0, vocab, (rows,), generator=g)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    times, loss = [], None
    for i in range(1 + repeats):
        h.grad = w.grad = None
        start = time.perf_counter()
        loss = linear_cross_entropy(h, w, y, impl, chunk=chunk or None)
        loss.backward()
        times.append(time.perf_counter() - start)
        if i == 0:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"impl": impl, "rows": rows, "extra_peak_mib": (peak - before) / 1024, "first_s": times[0],
            "step_s": min(times[1:]) if repeats else times[0], "loss": float(loss),
            "chunk": (chunk or default_chunk(rows, vocab, dim)) if impl == "chunked" else None}


def child_step(impl: str, spec: str, rows: int, repeats: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    from skiplab.bench.steps import build

    torch.set_num_threads(threads)
    model = build(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # AdamW's state made, so that the measured step adds activations alone
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (rows, model.cfg.context + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, loss = [], None
    for i in range(1 + repeats):
        start = time.perf_counter()
        loss = (F.cross_entropy(model(x).float().transpose(1, 2), y) if impl == "eager"
                else model(x, targets=y, head_loss=impl))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        if i == 0:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"impl": impl, "rows": rows, "tokens": rows * model.cfg.context, "extra_peak_mib": (peak - before) / 1024,
            "first_s": times[0], "step_s": min(times[1:]) if repeats else times[0], "loss": float(loss),
            "chunk": None, "parameters": sum(p.numel() for p in model.parameters())}


def markdown(result: dict) -> str:
    a, env = result["args"], result["environment"]
    run = f"torch {env['torch']}, code {env['git_commit']}, {a['threads']} thread(s), float32"
    tail = f"each row a fresh process; step: fastest of {a['repeats']} after the measured one."
    if a.get("model"):
        title = f"A training step of {a['model']}, eager and chunked head"
        about = (f"{run}, {result['runs'][0]['parameters']:,} parameters, AdamW (its state made before the measured "
                 f"step); {tail}")
        columns = [("sequences", "{rows}"), ("tokens", "{tokens}")]
    else:
        title = "The output layer and its cross-entropy"
        about = f"{run}; h (rows × {a['dim']}), W ({a['vocab']} × {a['dim']}); {tail}"
        columns = [("rows", "{rows}")]
    columns += [("head", "{impl}"), ("extra peak memory (MiB)", "{extra_peak_mib:.0f}"), ("step (s)", "{step_s:.2f}"),
                ("loss", "{loss:.6f}")] + ([] if a.get("model") else [("chunk rows", "{chunk}")])
    lines = [f"# {title}: {result['machine']}", "", about, "", "| " + " | ".join(c for c, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(f.format(**{**r, "chunk": r["chunk"] or ""}) for _, f in columns) + " |"
              for r in result["runs"]]
    if not a.get("model"):
        lines += ["", f"The logits alone of the largest row count: {result['logits_mib']:.0f} MiB in float32."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="2048,8192", help="row counts (batch × context), comma-separated")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--chunks", default="32,128", help="chunk sizes (rows) timed beside the default; '' for none")
    p.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="", help="a whole training step of this model spec instead of the head alone")
    p.add_argument("--out", default="", help="folder for head_loss.md and head_loss.json (step.md, step.json)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        counts = [int(r) for r in args.rows.split(",")]
        chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    except ValueError:
        p.error(f"--rows and --chunks take comma-separated whole numbers, got {args.rows!r} and {args.chunks!r}")
    if min(counts + chunks + [args.dim, args.vocab]) < 1 or args.repeats < 0 or args.threads < 1:
        p.error("--rows, --chunks, --dim, --vocab and --threads must be positive, --repeats at least 0")
    if args.child:
        print(json.dumps(child_step(args.child, args.model, counts[0], args.repeats, args.threads) if args.model else
                         child(args.child, counts[0], args.dim, args.vocab, args.chunk, args.repeats, args.threads)))
        return {}
    import torch

    from skiplab.bench.suite import environment, machine_name

    torch.set_num_threads(args.threads)  # the children's count, as the machine line names it
    runs = []
    for rows in counts:
        for impl, chunk in [("eager", 0), ("chunked", 0)] + ([] if args.model else [("chunked", c) for c in chunks]):
            cmd = [sys.executable, __file__, "--child", impl, "--rows", str(rows), "--dim", str(args.dim),
                   "--vocab", str(args.vocab), "--chunk", str(chunk), "--repeats", str(args.repeats),
                   "--threads", str(args.threads), "--model", args.model]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = runs[-1]
            how = f"{impl}, {r['chunk']} rows a chunk" if r["chunk"] else impl
            print(f"{rows} rows, {how}: +{r['extra_peak_mib']:.0f} MiB at the peak, {r['step_s']:.2f} s a step",
                  flush=True)
    result = {"machine": machine_name(), "environment": environment(), "args": vars(args), "runs": runs,
              "logits_mib": max(counts) * args.vocab * 4 / 2**20}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = "step" if args.model else "head_loss"
        (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / f"{name}.md").write_text(markdown(result))
    return result


if __name__ == "__main__":
    main()
