"""Helpers of the CPU kernels' tests: a kernel built from its C source with one line changed (the mutations that
prove an oracle can fail), whether an autograd graph ran a given function, and a hyper-connection with inputs to
compare with and without its kernels."""

import ctypes

import torch

import skiplab

from skiplab.connections.kernels import build


def mutated(name: str, signatures: dict, old: str, new: str, tmp_path, native: bool = False) -> ctypes.CDLL:
    """The kernel ``name`` built from its source with ``old`` replaced by ``new`` (which must be there), typed as
    ``signatures``; ``native``: for this processor (as the kernels are built), else for the generic one."""
    source = (build.HERE / f"{name}.c").read_text()
    assert old in source
    (tmp_path / "m.c").write_text(source.replace(old, new))
    build._compile(build._compiler(), tmp_path / "m.c", tmp_path / "m.so", native=native)
    return build.typed(ctypes.CDLL(str(tmp_path / "m.so")), signatures)


def ran(y, name: str) -> bool:
    """Whether the autograd graph of ``y`` holds a node of type ``name`` (a kernel's backward)."""
    seen, stack = set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == name:
            return True
        stack.extend(nxt for nxt, _ in node.next_functions)
    return False


def hyper_case(spec: str, dim: int = 24):
    """``(conn, layer, params, x, dy)``: the connection ``spec`` in float64 with its parameters moved off their
    initial values (seed 0), a linear sub-layer, every parameter, streams x (2, 5, n, dim) and a gradient at the
    output."""
    torch.manual_seed(0)
    conn = skiplab.connection(spec, dim=dim).double()
    with torch.no_grad():
        for p in conn.parameters():
            p.add_(0.1 * torch.randn_like(p))
    layer = torch.nn.Linear(dim, dim).double()
    params = [*conn.parameters(), *layer.parameters()]
    x = torch.randn(2, 5, conn.n, dim, dtype=torch.float64, requires_grad=True)
    return conn, layer, params, x, torch.randn_like(x)
