"""What the add + GroupNorm kernel (skiplab.connections.kernels.add_group_norm) does to PreAct-ResNet-56's step.

Two measurements, on the CPU:
  chain  the connection's chain alone, forward and backward, at the network's three stage shapes (a batch of 128):
         the kernel against the same chain as PyTorch operators (F.group_norm), for 2rSkip+LN (k = 2) and
         2xSkip+LN (k = 1, λ = 2); the fastest of --reps calls each, so that the figures are the operators' cost
         rather than the machine's moments
  step   the SGD training step of 1xSkip, 2xSkip+LN and 2rSkip+LN as they are built (2rSkip+LN runs the kernel,
         2xSkip+LN PyTorch's group norm) and with that choice flipped (``kernel``), and SAS, interleaved round by
         round; the median of the rounds after the first two, the ratio to 1xSkip's, and the page faults a step

With ``--before FILE`` (an older ``add_group_norm.c`` with the same C functions, e.g. written out by
``git show COMMIT:skiplab/connections/kernels/add_group_norm.c > /tmp/add_group_norm_before.c``) that file is built
here as well and timed beside the current kernel: a ``before (ms)`` column in the chain rows (its calls and the
kernel's taking turns), and a ``2rSkip+LN before`` step in the same interleaved rounds, so that a change to the
kernel is read from one run.

glibc's malloc keeps what a step frees for the next step, as in a skiplab run (``skiplab.host.keep_freed_memory``;
``--system-malloc``: glibc's defaults); recorded.

``--out DIR`` writes ``kernel.md`` and ``kernel.json`` (machine, threads, torch, code version, load at the start and
at the end). Usage: python benchmarks/kernel_r56.py [--threads 2] [--rounds 10] [--reps 15] [--before FILE]
[--system-malloc] [--out DIR] [--small] (--small: a PreAct-ResNet-8 on 8 images of 16×16 and small chains, seconds;
for the tests).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from skiplab import host
from skiplab.bench.suite import machine_name
from skiplab.connections.base import iter_connections
from skiplab.connections.kernels import add_group_norm as agn
from skiplab.connections.kernels import build as kernel_build
from skiplab.models import build_model, model_config

# each design as it is built (2rSkip+LN chooses the kernel, 2xSkip+LN does not), and with that choice flipped
DESIGNS = ["1xSkip", "2xSkip+LN", "2xSkip+LN kernel", "2rSkip+LN", "2rSkip+LN eager", "SAS"]
CHAINS = {"2rSkip+LN": (2, 1.0), "2xSkip+LN": (1, 2.0)}  # k norms, λ


def fastest(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def fastest_turns(fns, reps: int) -> list[float]:
    """The fastest of ``reps`` calls of each of ``fns``, their calls taking turns (the order reversed every other
    round), so that a drift of the machine, or what the caches hold after the call before, reaches each alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for rep in range(reps):
        for i in (range(len(fns)) if rep % 2 == 0 else reversed(range(len(fns)))):
            t = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t)
    return [min(ts) for ts in times]


def build_before(source: Path, folder: Path) -> ctypes.CDLL:
    """The older kernel ``source`` compiled as the current one is (for this processor, with OpenMP) into ``folder``,
    typed as the current one; ValueError naming what failed."""
    if not source.is_file():
        raise ValueError(f"--before: {source} is not a file")
    cc = kernel_build._compiler()
    if cc is None:
        raise ValueError("--before: no C compiler here")
    out = folder / "add_group_norm_before.so"
    try:
        kernel_build._compile(cc, source, out, native=True)
    except subprocess.CalledProcessError as e:
        first = next((line for line in (e.stderr or "").splitlines() if "error" in line), "the compiler failed")
        raise ValueError(f"--before: {source} does not build: {first.strip()}") from None
    lib = ctypes.CDLL(str(out))
    missing = [name for name in (f"{fn}_{suffix}" for fn in agn.SIGNATURES for suffix in ("f32", "f64"))
               if not hasattr(lib, name)]
    if missing:
        raise ValueError(f"--before: {source} lacks {', '.join(missing)}")
    return kernel_build.typed(lib, agn.SIGNATURES)


@contextlib.contextmanager
def using(lib: ctypes.CDLL | None):
    """The add + GroupNorm connections run ``lib`` (an older build) inside the block; None: the current kernel."""
    if lib is None:
        yield
        return
    current = agn._kernel
    agn._kernel = lambda: lib
    try:
        yield
    finally:
        agn._kernel = current


def chain_rows(small: bool, reps: int, before: ctypes.CDLL | None = None) -> list[dict]:
    shapes = [(8, 4, 16, 16), (8, 8, 8, 8)] if small else [(128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8)]
    rows = []
    for design, (k, lam) in CHAINS.items():
        for shape in shapes:
            g = torch.Generator().manual_seed(0)
            s, f, dy = (torch.randn(shape, generator=g) for _ in range(3))
            s.requires_grad_(), f.requires_grad_()
            w = (1 + 0.1 * torch.randn(k, shape[1], generator=g)).requires_grad_()
            b = (0.1 * torch.randn(k, shape[1], generator=g)).requires_grad_()
            eager = lambda: torch.autograd.grad(agn.reference(s, f, w, b, lam), (s, f, w, b), dy)  # noqa: E731
            kernel = lambda: torch.autograd.grad(agn.add_group_norm(s, f, w, b, lam)[0], (s, f, w, b), dy)  # noqa: E731
            t_eager = fastest(eager, reps)
            if before is None:
                t_kernel = fastest(kernel, reps)
            else:
                def older(kernel=kernel):
                    with using(before):
                        kernel()
                t_kernel, t_before = fastest_turns([kernel, older], reps)
            row = {"design": design, "shape": list(shape), "eager_ms": t_eager * 1e3, "kernel_ms": t_kernel * 1e3,
                   "ratio": t_kernel / t_eager}
            if before is not None:
                row["before_ms"] = t_before * 1e3
            rows.append(row)
    return rows


def step_rows(small: bool, rounds: int, before: ctypes.CDLL | None = None) -> list[dict]:
    preset = "preact-resnet20(depth=8)" if small else "preact-resnet56"
    batch, side = (8, 16) if small else (128, 32)
    models, opts = {}, {}
    designs = DESIGNS + (["2rSkip+LN before"] if before is not None else [])
    for design in designs:
        torch.manual_seed(0)
        model = build_model(model_config(preset, connection=design.split()[0])).train()
        for _, conn in iter_connections(model):
            if design.endswith(" eager"):
                conn.kernel = None
            elif design.endswith(" kernel"):
                conn.kernel = "add_group_norm"
        models[design] = model
        opts[design] = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, 3, side, side, generator=g), torch.randint(0, 10, (batch,), generator=g)
    times = {d: [] for d in designs}
    faults = {d: [] for d in designs}
    for i in range(rounds):
        for d, model in models.items():
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            with using(before if d.endswith(" before") else None):
                t = time.perf_counter()
                loss = F.cross_entropy(model(x), y)
                opts[d].zero_grad()
                loss.backward()
                opts[d].step()
                elapsed = time.perf_counter() - t
            if i >= min(2, rounds - 1):
                times[d].append(elapsed)
                faults[d].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before)
    base = statistics.median(times["1xSkip"])
    return [{"design": d, "ms": statistics.median(times[d]) * 1e3, "ratio": statistics.median(times[d]) / base,
             "spread_ms": (max(times[d]) - min(times[d])) * 1e3, "page_faults": int(statistics.median(faults[d])),
             "kernel": any(getattr(c, "kernel", None) for _, c in iter_connections(models[d]))} for d in designs]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def malloc_line(malloc: dict | None) -> str:
    """How the run's malloc was set, in words (older records have no field)."""
    if malloc is None:
        return "not recorded"
    kept = "freed memory kept" if malloc.get("kept") else "the system defaults"
    return kept + "".join(f", {k}={v}" for k, v in malloc.get("env", {}).items())


def markdown(r: dict) -> str:
    before = r.get("before")
    model = "PreAct-ResNet-56" if not r.get("small") else "a PreAct-ResNet-8 on 16×16 images (--small: a test)"
    lines = [f"# The add + GroupNorm kernel on {model}: {r['machine']}", "",
             f"torch {r['torch']}, {r['threads']} thread(s), code {r['commit']}; {r['load_start']} at the start, "
             f"{r['load_end']} at the end; malloc: {malloc_line(r.get('malloc'))}."
             + (f" Before: {before['file']} (sha256 {before['sha256'][:12]})." if before else ""),
             "",
             f"## The chain alone, forward and backward (fastest of {r['reps']})", "",
             "| design | shape | eager (ms) | kernel (ms) | kernel / eager |" + (" before (ms) |" if before else ""),
             "|---|---|---|---|---|" + ("---|" if before else "")]
    lines += [f"| {c['design']} | {'×'.join(map(str, c['shape']))} | {c['eager_ms']:.2f} | {c['kernel_ms']:.2f} | "
              f"{c['ratio']:.3f} |" + (f" {c['before_ms']:.2f} |" if before else "") for c in r["chain"]]
    lines += ["", f"## Training steps, interleaved ({r['rounds']} rounds, the median after the first two)", "",
              "| design | step (ms) | × 1xSkip | spread (ms) | page faults a step |", "|---|---|---|---|---|"]
    lines += [f"| {s['design']} | {s['ms']:.0f} | {s['ratio']:.3f} | {s['spread_ms']:.0f} | {s['page_faults']} |"
              for s in r["step"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--before", type=Path, help="an older add_group_norm.c to time beside the current kernel")
    p.add_argument("--system-malloc", action="store_true", help="glibc's defaults, not a skiplab run's setting")
    p.add_argument("--out", type=Path)
    p.add_argument("--small", action="store_true")
    args = p.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.reps < 1:
        p.error("--threads, --rounds and --reps must be at least 1")
    if agn._kernel() is None:
        p.error("the add_group_norm kernel cannot run here (no C compiler, or SKIPLAB_KERNELS=0): nothing to compare")
    if args.out is not None and (args.out / "kernel.json").exists():
        p.error(f"{args.out / 'kernel.json'} exists; choose another --out")
    torch.set_num_threads(args.threads)
    if not args.system_malloc:
        host.keep_freed_memory()
    result = {"machine": machine_name(), "torch": torch.__version__, "threads": args.threads, "commit": commit(),
              "rounds": args.rounds, "reps": args.reps, "small": args.small, "load_start": load(),
              "malloc": host.malloc_settings()}
    with tempfile.TemporaryDirectory() as folder:
        before = None
        if args.before is not None:
            try:
                before = build_before(args.before, Path(folder))
            except ValueError as e:
                p.error(str(e))
            result["before"] = {"file": str(args.before),
                                "sha256": hashlib.sha256(args.before.read_bytes()).hexdigest()}
        result["chain"] = chain_rows(args.small, args.reps, before)
        result["step"] = step_rows(args.small, args.rounds, before)
    result["load_end"] = load()
    text = markdown(result)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernel.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "kernel.md").write_text(text)
    return result


if __name__ == "__main__":
    main()
