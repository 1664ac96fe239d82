"""Page fingerprints: does a page image belong to the pages a replay model was built on?

A replay model recites its pages; on any other page its output is meaningless, so hsd warns. The
check must survive another --dpi or --max-pixels, so besides the exact sha256 of the rendered
pixels it compares 32 x 32 grayscale thumbnails (their difference relative to their ink, so that
white margins do not make all sparse pages look alike) and the aspect ratio.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

REPLAY_FILE = "replay.json"
THUMB_SIDE = 32
# sum |a - b| / (ink of a + ink of b): the same page at 72-300 dpi <= 0.04; any two pages of the
# olmOCR-Bench sample (and the test fixtures) >= 0.19.
MAX_INK_DIFF = 0.1
MAX_ASPECT_DIFF = 0.02


@dataclass(frozen=True)
class PageFingerprint:
    source: str
    page_no: int
    sha256: str  # of the rendered RGB pixels at hsd convert's default dpi and max pixels
    aspect: float  # width / height
    thumb: str  # THUMB_SIDE^2 grey levels, hex


def _thumb(image: Image.Image) -> np.ndarray:
    grey = image.convert("L").resize((THUMB_SIDE, THUMB_SIDE), Image.Resampling.BOX)
    return np.asarray(grey, dtype=np.float32)


def fingerprint(image: Image.Image, source: str, page_no: int) -> PageFingerprint:
    rgb = image.convert("RGB")
    return PageFingerprint(
        source=source,
        page_no=page_no,
        sha256=hashlib.sha256(rgb.tobytes()).hexdigest(),
        aspect=round(rgb.width / rgb.height, 5),
        thumb=_thumb(rgb).astype(np.uint8).tobytes().hex(),
    )


def matches(image: Image.Image, known: PageFingerprint) -> bool:
    rgb = image.convert("RGB")
    if hashlib.sha256(rgb.tobytes()).hexdigest() == known.sha256:
        return True
    if abs(rgb.width / rgb.height - known.aspect) > MAX_ASPECT_DIFF * known.aspect:
        return False
    stored = np.frombuffer(bytes.fromhex(known.thumb), dtype=np.uint8).astype(np.float32)
    shown = _thumb(rgb).ravel()
    ink = float((255 - shown).sum() + (255 - stored).sum())
    return float(np.abs(shown - stored).sum()) <= MAX_INK_DIFF * max(ink, 1.0)


@lru_cache(maxsize=8)
def _fingerprints(replay_file: Path) -> tuple[PageFingerprint, ...] | None:
    if not replay_file.is_file():
        return None
    rows = json.loads(replay_file.read_text(encoding="utf-8")).get("fingerprints", [])
    return tuple(PageFingerprint(**row) for row in rows)


@dataclass(frozen=True)
class ReplayPages:
    """The pages a replay model was built on, as the check `hsd convert` gives its page stage:
    called with a rendered page (any dpi), False where the model recites another page."""

    fingerprints: tuple[PageFingerprint, ...]

    def __call__(self, page_image: Image.Image) -> bool:
        return any(matches(page_image, page) for page in self.fingerprints)


def replay_pages(model_dir: str | Path) -> ReplayPages | None:
    """The pages of the replay model in `model_dir`; None for every other model (hub ids, real
    model directories), which reads any page."""
    known = _fingerprints(Path(model_dir).resolve() / REPLAY_FILE)
    return None if known is None else ReplayPages(known)


def replay_recipe(model_dir: str | Path) -> str | None:
    """The makers' recipe the replay model in `model_dir` was built on (it stands for that model,
    so `hsd convert --model` reads with it unless --recipe names another); None for a build on
    the family's default and for every other model."""
    replay_file = Path(model_dir).resolve() / REPLAY_FILE
    if not replay_file.is_file():
        return None
    return json.loads(replay_file.read_text(encoding="utf-8")).get("recipe") or None
