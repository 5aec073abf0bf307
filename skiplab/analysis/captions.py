"""A figure of images with their captions: each image on a row, a reference caption and every run's caption beside
it, so that what a captioner says can be checked against what the picture shows (``skiplab eval caption --figure``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np


def draw_captions(images: list[np.ndarray], references: list[str], captions: dict[str, list[str]],
                  out: str | Path, title: str = "", width: int = 70) -> Path:
    """Write ``out``: image k (uint8, (H, W) or (H, W, C)) beside ``references[k]`` and, for each label of
    ``captions`` (a run), that run's caption of image k. Captions wrap at ``width`` characters."""
    if not images:
        raise ValueError("a caption figure needs at least one image")
    if len(references) != len(images) or any(len(c) != len(images) for c in captions.values()):
        raise ValueError(f"a caption figure needs one reference and one caption of each run per image "
                         f"({len(images)} images)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines_per_image = [sum(len(textwrap.wrap(t, width)) or 1 for t in [references[k], *[c[k] for c in
                       captions.values()]]) for k in range(len(images))]
    heights = [max(1.3, 0.2 * n + 0.2) for n in lines_per_image]
    fig, axes = plt.subplots(len(images), 2, figsize=(9, sum(heights) + (0.4 if title else 0)),
                             gridspec_kw={"width_ratios": [1, 5], "height_ratios": heights}, squeeze=False)
    for k, image in enumerate(images):
        ax_img, ax_txt = axes[k]
        grey = image.ndim == 2 or image.shape[-1] == 1
        ax_img.imshow(image.squeeze(-1) if image.ndim == 3 and grey else image, cmap="gray" if grey else None,
                      vmin=0, vmax=255)
        ax_img.set_axis_off()
        ax_txt.set_axis_off()
        y = 1.0
        for label, text, colour in [("reference", references[k], "0.35"),
                                    *[(name, c[k], f"C{i}") for i, (name, c) in enumerate(captions.items())]]:
            wrapped = textwrap.wrap(text, width) or [""]
            ax_txt.text(0.0, y, f"{label}:", color=colour, fontsize=8, fontweight="bold", va="top",
                        transform=ax_txt.transAxes)
            ax_txt.text(0.2, y, "\n".join(wrapped), color=colour, fontsize=8, va="top", transform=ax_txt.transAxes)
            y -= len(wrapped) / lines_per_image[k]
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
