"""Rows the model keeps in flight where `--max-rows` is not given: by default, as many as the KV
cache's share of the device's memory holds, and no more than the run's documents split into
(`run_parts`: a long document splits into parts of at least config.MIN_PART_PAGES pages, each a
row; batch.resolve.default_rows).

On a GPU (or MPS) a row is budgeted at its longest: the prompt of an A4 page at the run's render
size plus the family's `max_new_tokens`, so that no mix of pages outgrows the cache. The budget
is the device's total memory, not what is free at the start, so that a resumed run chooses the
same rows (a page's counts are priced at the rows: README). The host's memory bounds them too: a
row is a document in flight in the worker, and half the available memory is left to the draft
processes (draft_processes.default_draft_processes).

On the CPU: one row. A forward there is compute-bound from a few rows: `hsd convert` read the
OmniDocBench pages with 8 rows at 0.87x the pages per second of one without a cost profile and
1.18x with one (docs/BENCHMARKS.md). And a page's wall time grows with the rows that share its
forwards, while --page-timeout counts wall time. `--max-rows N` takes more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from hsd_cli.config import ModelConfig, most_parts, select_pages
from hsd_cli.recipes.sizes import hsd_render_scale

GIB = 1 << 30
MAX_DEFAULT_ROWS = 256  # vLLM's default max_num_seqs
DEVICE_SHARE = 0.9  # of the device's memory planned for (vLLM's gpu_memory_utilization)
WORKSPACE_BYTES = 4 * GIB  # beside weights and caches: a prefill's activations, a step's logits
# A document in flight in the worker, beside the model: its open PDF, pages, drafts and the
# pipeline's state. Measured with the model on the CPU (so an upper figure): the worker's peak
# grew from 1,642-1,817 MiB at one row to 3,276-3,514 MiB at 8 (docs/BENCHMARKS.md).
HOST_BYTES_PER_ROW = 256 << 20
A4_PT = (595.0, 842.0)  # the larger of A4 and Letter


@dataclass(frozen=True)
class RowsChoice:
    rows: int
    why: str  # the run's first line says it


def device_rows(device_bytes: int, weight_bytes: int, row_bytes: int) -> int:
    """Rows whose caches fit beside the weights and the workspace in DEVICE_SHARE of the device."""
    return max(0, int((device_bytes * DEVICE_SHARE - weight_bytes - WORKSPACE_BYTES) // row_bytes))


def host_rows(host_bytes: int) -> int:
    """Documents in flight that half of the host's available memory holds."""
    return host_bytes // 2 // HOST_BYTES_PER_ROW


def a4_page(dpi: int, max_pixels: int) -> Image.Image:
    """A blank A4 page as the run renders it: the prompt a row is budgeted for."""
    scale = hsd_render_scale(A4_PT, dpi, max_pixels)
    return Image.new("RGB", (round(A4_PT[0] * scale), round(A4_PT[1] * scale)), "white")


def bounded(*rows: int) -> int:
    """At least one row (the model alone decides whether it fits), at most MAX_DEFAULT_ROWS."""
    return max(1, min(MAX_DEFAULT_ROWS, *rows))


def device_rows_choice(model: ModelConfig, page: Image.Image) -> RowsChoice:
    """The rows a run with this model keeps in flight by default, `page` the largest page it
    expects (an A4 page at the run's render size: `a4_page`)."""
    from transformers import AutoConfig

    from hsd_cli.processes import available_memory
    from hsd_cli.decoding.hf_target.footprint import device_memory, model_footprint

    device_bytes = device_memory(model.device)
    if device_bytes is None:
        return RowsChoice(1, "the model runs on the CPU; --max-rows N keeps more in flight")
    config = AutoConfig.from_pretrained(model.model, trust_remote_code=model.trust_remote_code)
    footprint = model_footprint(config, model.dtype, model.trust_remote_code)
    tokens = row_tokens(model, page)
    on_device = device_rows(device_bytes, footprint.weight_bytes, footprint.row_bytes(tokens))
    why = f"{model.device}'s {device_bytes / GIB:.0f} GiB hold {on_device} rows of {tokens:,} tokens"
    host_bytes = available_memory()
    if host_bytes is None:
        return RowsChoice(bounded(on_device), why)
    on_host = host_rows(host_bytes)
    return RowsChoice(bounded(on_device, on_host), f"{why}; half the host's {host_bytes / GIB:.0f} GiB available, {on_host} documents")


def row_tokens(model: ModelConfig, page: Image.Image) -> int:
    """A row at its longest: the prompt of `page` (the largest the run expects) and the family's
    `max_new_tokens`."""
    from hsd_cli.decoding.hf_target.footprint import prompt_tokens
    from hsd_cli.models.family_settings import settings_for

    prompt = settings_for(model.family).page_prompt
    return prompt_tokens(model.model, model.family, page, prompt, model.trust_remote_code) + model.max_new_tokens


def row_slots(model: ModelConfig, page: Image.Image) -> int:
    """The KV store's slots a row: its longest (`row_tokens`) and the widest tree a step verifies
    past it (the largest width bucket: tree.WIDTH_BUCKETS), so that the store is allocated once at
    the budget the rows were chosen for, never doubled past it."""
    from hsd_cli.decoding.tree import WIDTH_BUCKETS

    return row_tokens(model, page) + WIDTH_BUCKETS[-1]


def page_count(path: Path, kind: str | None, password: str | None) -> int:
    """The document's pages as far as opening it tells (0 where it cannot be opened: it fails as a
    whole in its worker), without rendering any."""
    import pymupdf

    try:
        with pymupdf.open(path, filetype=kind) as document:
            if document.needs_pass and not document.authenticate(password or ""):
                return 0
            return document.page_count
    except Exception:  # noqa: BLE001 - a broken file is its worker's to report
        return 0


def run_parts(documents: Sequence[tuple[Path, str | None]], pages: str | None, password: str | None, enough: int) -> int:
    """Into how many parts the run's (path, kind) documents split at most (config.document_parts,
    over the `--pages` selected), counted up to `enough`: rows beyond it would only be priced, never
    filled. A document that cannot be opened counts as one."""
    parts = 0
    for path, kind in documents:
        if parts >= enough:
            break
        parts += most_parts(len(select_pages(pages, page_count(path, kind, password))))
    return min(parts, enough)
