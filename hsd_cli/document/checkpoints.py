"""A document's page checkpoints: each finished page (and, while a model reads it, its draft) is
pickled, so that a document whose worker was killed (timeout, crash, SIGKILL of the whole run)
resumes at the page where it stopped."""

from __future__ import annotations

import pickle
from dataclasses import fields
from pathlib import Path

from hsd_cli.output.files import write_atomic
from hsd_cli.records.page import Page, Reading


def checkpoint_path(checkpoint_dir: Path, page_no: int, stage: str = "page") -> Path:
    return checkpoint_dir / f"{stage}-{page_no:05d}.pickle"


def save_checkpoint(path: Path, page: Page) -> None:
    write_atomic(path, pickle.dumps(page))


def load_checkpoint(path: Path) -> Page | None:
    """The page as checkpointed, None where there is none or it is not this hsd's (a checkpoint an
    earlier version wrote, left by a killed run, is redone)."""
    if not path.exists():
        return None
    try:
        with path.open("rb") as handle:
            page = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    if not isinstance(page, Page) or any(not hasattr(page, f.name) for f in fields(Page)):
        return None
    # A reading's field with a default reads as its default where an earlier hsd wrote none: look in its own slots.
    reading = page.reading
    return page if reading is None or isinstance(reading, Reading) and all(f.name in vars(reading) for f in fields(Reading)) else None
