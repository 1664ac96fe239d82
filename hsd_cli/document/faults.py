"""What goes wrong on a page: a stage that raises is tried again, and the debug settings that make
a stage stall, crash or raise on purpose (for trying the timeouts and worker deaths; the tests use
them too)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hsd_cli.document.inputs import InputDocument
from hsd_cli.stages.draft import exception_line

PAGE_ATTEMPTS = 2  # a page that raises is tried once more before it is marked failed


def debug_fault(doc: InputDocument, page_no: int, stage: str) -> None:
    """HSD_DEBUG_STALL=<file name>:<page>[:vlm] hangs that page's draft (or VLM) stage, as a
    looping decode or a stuck native library would; HSD_DEBUG_CRASH=<file name>:<page> kills the
    worker there, as a segfault would; HSD_DEBUG_RAISE=<file name>:<page>[:vlm] makes the stage
    raise, as a library's error would. Read here only, in the worker."""
    wanted = {f"{doc.path.name}:{page_no}:{stage}"} | ({f"{doc.path.name}:{page_no}"} if stage == "draft" else set())
    if os.environ.get("HSD_DEBUG_STALL", "") in wanted:
        time.sleep(3600)
    if os.environ.get("HSD_DEBUG_CRASH", "") in wanted:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("HSD_DEBUG_RAISE", "") in wanted:
        raise RuntimeError(f"HSD_DEBUG_RAISE on the {stage} stage")


@dataclass(frozen=True)
class PageError:
    """The exception a page's stage raised on its last attempt."""

    message: str  # "TypeName: message", on one line
    traceback: str


def with_retries(work: Callable[[], Any]) -> tuple[Any, PageError | None]:
    """Run `work` up to PAGE_ATTEMPTS times; (result, None) or (None, the last error)."""
    error = None
    for _ in range(PAGE_ATTEMPTS):
        try:
            return work(), None
        except Exception as exc:  # noqa: BLE001 - a bad page must not sink its document
            error = PageError(exception_line(exc), traceback.format_exc())
    return None, error
