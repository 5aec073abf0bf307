import pytest
import torch
from torch import nn

DIM = 6


def make_input(layout: str, dim: int = DIM, seed: int = 0) -> torch.Tensor:
    """A batch in the layout: (B, T, C) for seq, (N, C, H, W) for conv; not centred, not unit scale."""
    g = torch.Generator().manual_seed(seed)
    shape = (3, 5, dim) if layout == "seq" else (4, dim, 3, 3)
    return (torch.randn(shape, generator=g) * 1.7 + 0.3).requires_grad_()


def make_branch(layout: str, dim: int = DIM, seed: int = 1) -> nn.Module:
    """A small non-linear branch F that keeps the shape."""
    torch.manual_seed(seed)
    if layout == "seq":
        return nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
    return nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1), nn.Tanh(), nn.Conv2d(dim, dim, 1))


def randomise_affine(module: nn.Module, seed: int = 2) -> None:
    """Move every norm's gain and bias away from 1 and 0, so formulas that ignore them fail."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and ("norm" in name or name.startswith("weight")):
                p.copy_(p + 0.5 * torch.randn(p.shape, generator=g))


@pytest.fixture(params=["seq", "conv"])
def layout(request):
    return request.param
