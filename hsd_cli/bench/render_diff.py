"""`hsd bench render-diff`: how far hsd's pixels (PyMuPDF at the recipe's size) are from the
makers' renderer's at the same size (poppler's pdftoppm for olmOCR), page by page: the mean
absolute difference per channel (0-255), the share of pixels that differ by more than 32 in some
channel, and the share of ink (dark pixels) each renderer puts where the other has none. What the
differences do to a model's text cannot be measured without the model; this says how big they
are, before a renderer is added as a dependency (issue 50)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated

import typer

INK = 128  # a channel below this is ink


def pdftoppm_render(pdf: Path, page_no: int, size: tuple[int, int]):
    """The page as pdftoppm draws it at exactly `size` pixels (-scale-to-x/-y), as RGB."""
    from PIL import Image

    with tempfile.TemporaryDirectory() as work:
        prefix = Path(work) / "page"
        subprocess.run(
            ["pdftoppm", "-png", "-f", str(page_no), "-l", str(page_no), "-scale-to-x", str(size[0]),
             "-scale-to-y", str(size[1]), str(pdf), str(prefix)],
            check=True, capture_output=True,
        )
        (made,) = Path(work).glob("page*.png")
        with Image.open(made) as image:
            return image.convert("RGB")


def pixel_difference(ours, theirs) -> dict[str, float]:
    """Mean absolute difference per channel, share of pixels off by more than 32, and the ink
    each has where the other has none (shares of all pixels)."""
    import numpy as np

    a, b = np.asarray(ours, dtype=np.int16), np.asarray(theirs, dtype=np.int16)
    diff = np.abs(a - b)
    ink_a, ink_b = a.min(-1) < INK, b.min(-1) < INK
    return {
        "mean_abs": float(diff.mean()),
        "over_32": float((diff.max(-1) > 32).mean()),
        "ink_only_hsd": float((ink_a & ~ink_b).mean()),
        "ink_only_makers": float((ink_b & ~ink_a).mean()),
        "ink": float(ink_b.mean()),
    }


def render_diff(
    pdfs: Annotated[Path, typer.Argument(help="A directory of PDFs (searched recursively).")],
    recipe: Annotated[str, typer.Option(help="A recipe whose makers render with pdftoppm.")] = "olmocr-2",
) -> None:
    """hsd's pixels against the makers' renderer's, at the recipe's size."""
    import pymupdf  # here, not at import: the parent of `hsd convert` imports the benches' CLI

    from hsd_cli.recipes.registry import recipe_for
    from hsd_cli.stages.rasterize import render_for_model

    chosen = recipe_for(recipe)
    if chosen is None or chosen.render.renderer != "pdftoppm":
        print(f"error: --recipe {recipe}: not a recipe whose makers render with pdftoppm")
        raise typer.Exit(2)
    if shutil.which("pdftoppm") is None:
        print("error: pdftoppm (poppler-utils) is not installed")
        raise typer.Exit(4)
    rows = []
    print(f"{'page':44} {'size':>10} {'mean|d|':>8} {'>32':>7} {'ink hsd':>8} {'ink mk':>8} {'ink':>6}")
    for path in sorted(pdfs.rglob("*.pdf")):
        with pymupdf.open(path) as doc:
            for page in doc:
                ours = render_for_model(page, chosen.render)
                theirs = pdftoppm_render(path, page.number + 1, ours.size)
                row = pixel_difference(ours, theirs)
                rows.append(row)
                name = f"{path.relative_to(pdfs)}#{page.number + 1}"
                print(f"{name[-44:]:44} {ours.width:>4}x{ours.height:<5} {row['mean_abs']:8.2f} {row['over_32']:7.3%} "
                      f"{row['ink_only_hsd']:8.3%} {row['ink_only_makers']:8.3%} {row['ink']:6.1%}")
    if rows:
        mean = {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}
        print(f"{'mean of ' + str(len(rows)) + ' pages':44} {'':>10} {mean['mean_abs']:8.2f} {mean['over_32']:7.3%} "
              f"{mean['ink_only_hsd']:8.3%} {mean['ink_only_makers']:8.3%} {mean['ink']:6.1%}")
