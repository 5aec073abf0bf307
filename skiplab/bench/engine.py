"""The bench groups that time the engine and the machine: ``machine`` (matmul rate, add bandwidth: the ceilings the
other groups are read against), ``engine`` (skiplab's Transformer against ``torch.nn.Transformer``, cached beam
search, achieved FLOP/s, padding, the norms), ``compile`` (compiled against eager) and ``processes`` (DDP over two
processes against one)."""

from __future__ import annotations

import faulthandler
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.multiprocessing.spawn import ProcessException

from ..connections.norms import make_norm
from ..corpora import encode_parallel, load_corpus, make_batches
from ..decoding import beam_search
from ..tokenization import Tokenizer
from .shapes import QUICK, Sizes, image_batch, image_model, mt_batch, mt_model
from .steps import RecomputingDecoder, TorchTransformer, add_bandwidth, image_step, matmul_rate, mt_step
from .timing import Row, interleaved


def machine(sz: Sizes, ctx: dict) -> list[Row]:
    ctx["matmul"] = matmul_rate(sz.matmul_n)
    ctx["add_bw"] = add_bandwidth(sz.add_elements)
    return [Row("machine", f"float32 matmul {sz.matmul_n}^3", ctx["matmul"] / 1e9, "GFLOP/s", "best of 5"),
            Row("machine", f"add bandwidth, {sz.add_elements:,} floats", ctx["add_bw"] / 1e9, "GB/s",
                "2 reads + 1 write per element")]


def engine(sz: Sizes, ctx: dict) -> list[Row]:
    rows = []
    batch = mt_batch(sz)
    ours = mt_model(sz, f"{sz.mt_model}(connection=PostLN)")
    torch.manual_seed(0)
    ref = TorchTransformer(ours.cfg).train()
    t = interleaved({"skiplab": mt_step(ours, batch), "torch": mt_step(ref, batch)}, sz.repeats, sz.warmup)
    rows.append(Row("engine", "skiplab Transformer / torch.nn.Transformer", t["skiplab"] / t["torch"], "x",
                    "training step, same shape, embeddings and loss"))

    ours.eval()
    src = batch.src[: sz.beam_sentences]
    cached = lambda: beam_search(ours, src, beam=4, max_len_a=0, max_len_b=sz.beam_len)  # noqa: E731
    recompute = lambda: beam_search(RecomputingDecoder(ours), src, beam=4, max_len_a=0, max_len_b=sz.beam_len)  # noqa: E731
    with torch.no_grad():
        t = interleaved({"cached": cached, "recompute": recompute}, max(2, sz.repeats // 4), 1)
    rows.append(Row("engine", f"beam 4, {sz.beam_len} steps: recomputing the prefix / cached", t["recompute"] / t["cached"],
                    "x", "speed-up of the key/value cache"))

    achieved = ctx["mt_flops"] / ctx["mt_step"]
    rows.append(Row("engine", "achieved training FLOP/s / matmul rate", 100 * achieved / ctx["matmul"], "%",
                    f"{sz.mt_model} PostLN step: {achieved / 1e9:.1f} GFLOP/s"))

    src_ids, tgt_ids, source = padding_sample(sz, ctx.get("data_dir"))
    batches = make_batches(src_ids, tgt_ids, 4096)
    real = sum(len(s) + 1 for s in src_ids) + sum(len(t) + 1 for t in tgt_ids)
    slots = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    rows.append(Row("engine", "padding share of 4096-token batches", 100 * (1 - real / slots), "%", source))

    x = torch.randn(sz.norm_rows, sz.norm_dim, requires_grad=True)
    dy = torch.randn_like(x)
    ln, rms, ours = nn.LayerNorm(sz.norm_dim), nn.RMSNorm(sz.norm_dim), make_norm("RMS", sz.norm_dim)
    t = interleaved({"LN": lambda: ln(x).backward(dy), "RMS": lambda: rms(x).backward(dy),
                     "ours": lambda: ours(x).backward(dy)}, sz.repeats * 3, sz.warmup)
    what = f"forward + backward ({sz.norm_rows}x{sz.norm_dim})"
    rows.append(Row("engine", f"nn.RMSNorm / nn.LayerNorm, {what}", t["RMS"] / t["LN"], "x", "same input"))
    rows.append(Row("engine", f"skiplab's fused RMSNorm / nn.LayerNorm, {what}", t["ours"] / t["LN"], "x",
                    "same input; what +RMS and PreRMS use"))
    return rows


def padding_sample(sz: Sizes, data_dir: str | None) -> tuple[list[list[int]], list[list[int]], str]:
    """Token-id sequences to cut batches from: Multi30k's training pairs in an 8k joint BPE where its files
    are (full sizes), else lengths drawn around Multi30k's mean (about 16 subwords)."""
    if sz is not QUICK and data_dir:
        try:
            data = load_corpus("multi30k", data_dir, "en", "de", "train", download=False)
        except (OSError, ValueError):
            data = None
        if data is not None:
            with tempfile.TemporaryDirectory() as tmp:
                tok = Tokenizer.train(data.src + data.tgt, f"{tmp}/spm", 8000)
            src, tgt = encode_parallel(tok, data)
            return src, tgt, f"Multi30k en-de train, {len(src)} pairs, 8k BPE"
    g = torch.Generator().manual_seed(0)
    n = 200 if sz is QUICK else 2000
    lens = (torch.randn(n, 2, generator=g) * 5 + 16).clamp(min=2).round().int().tolist()
    return [[4] * a for a, _ in lens], [[4] * b for _, b in lens], f"synthetic lengths 16 ± 5, {n} pairs"


def compiled(sz: Sizes, ctx: dict) -> list[Row]:
    rows = []
    batch = image_batch(sz)
    for design in ("1xSkip", "2rSkip+LN"):
        eager, comp = image_model(sz.compile_depth, design), image_model(sz.compile_depth, design)
        fwd = torch.compile(comp, backend=sz.compile_backend)
        start = time.perf_counter()
        image_step(comp, batch, fwd)()  # the first call compiles forward and backward
        secs = time.perf_counter() - start
        t = interleaved({"eager": image_step(eager, batch), "compiled": image_step(comp, batch, fwd)}, sz.repeats, sz.warmup)
        ctx[f"compiled_{design}"] = t["compiled"]
        rows.append(Row("compile", f"PreAct-ResNet-{sz.compile_depth} {design}: compiled / eager", t["compiled"] / t["eager"],
                        "x", f"{sz.compile_backend}; first step (compiling) {secs:.0f} s"))
    rows.append(Row("compile", f"PreAct-ResNet-{sz.compile_depth} compiled: 2rSkip+LN / 1xSkip",
                    ctx["compiled_2rSkip+LN"] / ctx["compiled_1xSkip"], "x", "both compiled"))
    mb = mt_batch(sz)
    eager, comp = (mt_model(sz, f"{sz.mt_model}(connection=PostLN)") for _ in range(2))
    fwd = torch.compile(comp, dynamic=sz.compile_dynamic, backend=sz.compile_backend)
    start = time.perf_counter()
    mt_step(comp, mb, fwd)()
    secs = time.perf_counter() - start
    t = interleaved({"eager": mt_step(eager, mb), "compiled": mt_step(comp, mb, fwd)}, sz.repeats, sz.warmup)
    rows.append(Row("compile", f"{sz.mt_model} PostLN: compiled ({'dynamic' if sz.compile_dynamic else 'static'} shapes) / eager", t["compiled"] / t["eager"], "x",
                    f"{sz.compile_backend}; first step (compiling) {secs:.0f} s"))
    return rows


DEADLINE_S = 600  # the longest one run of the processes benchmark may take before its ranks stop


def _guarded(rank: int, fn, deadline: float, *args) -> None:
    """``fn(rank, *args)`` in a spawned rank that, past ``deadline`` seconds, prints every thread's stack (where it
    waits, even inside gloo's C++) and exits with code 1, so a rank that hangs ends the run instead of the caller."""
    faulthandler.dump_traceback_later(deadline, exit=True)
    try:
        fn(rank, *args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def spawn_ranks(fn, args: tuple, world: int, deadline: float = DEADLINE_S) -> None:
    """Run ``fn(rank, *args)`` in ``world`` spawned processes and wait for them; a rank that fails raises here, and
    ranks still running after ``deadline`` seconds print their stacks and stop: RuntimeError."""
    ctx = mp.start_processes(_guarded, args=(fn, deadline, *args), nprocs=world, start_method="spawn", join=False)
    give_up = time.monotonic() + deadline + 30  # the ranks' own watchdogs fire first
    name = getattr(fn, "__name__", str(fn))
    try:
        while not ctx.join(timeout=1):  # True once every rank has exited with 0; raises when one failed
            if time.monotonic() > give_up:
                raise RuntimeError(f"{world} process(es) of {name} still running after {deadline + 30:g} s")
    except ProcessException as err:
        raise RuntimeError(f"{world} process(es) of {name} did not finish: {str(err).strip()} (a rank still running "
                           f"after {deadline:g} s prints its threads' stacks on stderr and exits with code 1)"
                           ) from None
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_steps(rank: int, world: int, sz: Sizes) -> float:
    """Seconds per DDP training step of this rank on its share of one global batch."""
    import torch.distributed as dist

    model = image_model(sz.compile_depth, "1xSkip")
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    x, y = image_batch(sz)
    share = slice(rank * len(y) // world, (rank + 1) * len(y) // world)
    step = image_step(model, (x[share], y[share]), ddp)
    for _ in range(sz.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(sz.process_steps):
        step()
    dist.barrier()
    return (time.perf_counter() - start) / sz.process_steps


def _ddp_worker(rank: int, world: int, port: int, sz: Sizes, threads: int, out: str) -> None:
    """One rank of the processes benchmark.

    DDP's Reducer is freed before the process group is destroyed. A Reducer that outlives the group's registration
    frees the group itself, holding the GIL while it joins gloo's worker threads, and a worker still freeing the
    last barrier waits for the GIL: a deadlock (2-core Xeon, quick sizes: 5 runs in 120 with the Reducer freed last,
    none in 260 in this order). Freed while the group is registered, the Reducer only lets go of it, and
    ``destroy_process_group`` frees it without the GIL."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        secs = _ddp_steps(rank, world, sz)
        if rank == 0:
            Path(out).write_text(str(secs))
    finally:
        dist.destroy_process_group()


def processes(sz: Sizes, ctx: dict) -> list[Row]:
    threads = max(2, torch.get_num_threads())
    secs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            out = f"{tmp}/{world}"
            spawn_ranks(_ddp_worker, (world, _free_port(), sz, threads // world, out), world)
            secs[world] = float(Path(out).read_text())
    return [Row("processes", f"PreAct-ResNet-{sz.compile_depth}, global batch {sz.image_batch}: 2 processes / 1",
                secs[1] / secs[2], "x", f"speed-up; {threads // 2} thread(s) each vs 1 process x {threads} threads, gloo")]
