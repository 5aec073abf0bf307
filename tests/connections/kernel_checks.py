"""Helpers of the CPU kernels' tests: a kernel built from its C source with one line changed (the mutations that
prove an oracle can fail), and whether an autograd graph ran a given function."""

import ctypes

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
