"""Pages read at once by the worker's threads share one batch of the model (`--max-rows`): each
page's reading (text and counts) is the one it gets alone, whichever way it is read; a page past
its deadline keeps its draft, flagged."""

import json
import threading
import time
from dataclasses import replace

import pymupdf
import pytest

from hsd_cli.config import ConvertConfig, Stages
from hsd_cli.output.json_doc import stats_json
from hsd_cli.document.pipeline import DocumentSoFar, draft_stage, vlm_stage
from hsd_cli.records.kinds import PageFlag
from hsd_cli.stages.draft import make_draft_backend
from hsd_cli.stages.outcome import TIMED_OUT_WHY
from tests.fixtures import half_node_profile, model_config


@pytest.fixture(scope="module")
def drafted_pages(docs_dir):
    config = ConvertConfig(output_dir=docs_dir)
    pages = []
    for name in ("report.pdf", "scan.pdf"):
        with pymupdf.open(docs_dir / name) as pdf:
            backend = make_draft_backend(config, name)
            pages += [draft_stage(pdf[index], backend, config) for index in range(pdf.page_count)]
    return pages


def vlm_model(tiny_model, max_rows):
    from hsd_cli.serving.model import VlmModel

    return VlmModel(model_config(tiny_model, dtype="float32", max_new_tokens=12), rows=max_rows)


def reading(page):
    return page.text, page.flags, json.dumps(stats_json(page), sort_keys=True)


# Every way a page is read: whole trees, region batches, rows packed with their page's.
WAYS = [Stages.PAGE, Stages.REGION_PAGE, Stages.PACKED]


def test_pages_read_together_read_as_alone(tiny_model, drafted_pages):
    work = [(page, WAYS[index % len(WAYS)]) for index, page in enumerate(drafted_pages)]
    alone_model = vlm_model(tiny_model, 1)
    alone = [reading(vlm_stage(page, alone_model, way, DocumentSoFar())) for page, way in work]
    shared_model = vlm_model(tiny_model, 8)
    together, batch_rows = [None] * len(work), []

    def read(index):
        page, way = work[index]
        read = vlm_stage(page, shared_model, way, DocumentSoFar())
        together[index] = reading(read)
        if way is Stages.PAGE:  # a call of one row: more rows in its forwards were other pages'
            batch_rows.extend(rows for rows, _, _ in read.reading.result.stats.steps)

    threads = [threading.Thread(target=read, args=(index,)) for index in range(len(work))]
    with shared_model.engine.exclusive():  # every page's first read waits, so that they share forwards
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(shared_model.engine._waiting) < len(work) - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert together == alone
    assert max(batch_rows) > 1, "pages shared forwards"
    assert all(PageFlag.VLM in flags for _, flags, _ in together)


@pytest.mark.parametrize("max_rows", [1, 4])
def test_a_page_past_its_deadline_keeps_its_draft(tiny_model, drafted_pages, max_rows):
    page = drafted_pages[0]
    read = vlm_stage(page, vlm_model(tiny_model, max_rows), Stages.PACKED, DocumentSoFar(), deadline=time.monotonic() - 1)
    assert read.flags[:2] == (PageFlag.FALLBACK, PageFlag.TIMEOUT)
    assert read.notice.startswith(TIMED_OUT_WHY) and read.reading is None
    assert read.blocks == page.blocks, "the draft stands in"
    assert replace(read, flags=page.flags, notice=page.notice, plan=page.plan) == page


def test_batch_sizing_gives_every_read_the_workers_one_sizer_and_reads_what_alone_reads(tiny_model, drafted_pages, tmp_path):
    from hsd_cli.config import Sizing
    from hsd_cli.serving.model import VlmModel

    profile = half_node_profile(tmp_path / "profile.json")

    def model(sizing):
        return VlmModel(model_config(tiny_model, dtype="float32", max_new_tokens=12, profile=str(profile)), rows=8, sizing=sizing)

    pictures = [page.picture for page in drafted_pages[:2]]
    per_page = model(Sizing.PAGE)
    assert per_page.sizer(pictures[0]) is not per_page.sizer(pictures[1])
    batch = model(Sizing.BATCH)
    assert batch.sizer(pictures[0]) is batch.sizer(pictures[1]), "one width for every row in flight"
    assert batch.sizer(pictures[0]).batch_rows is None, "priced at the rows in flight"

    alone_model = vlm_model(tiny_model, 1)
    alone = [vlm_stage(page, alone_model, Stages.PAGE, DocumentSoFar()).text for page in drafted_pages]
    together = [None] * len(drafted_pages)

    def read(index):
        together[index] = vlm_stage(drafted_pages[index], batch, Stages.PAGE, DocumentSoFar()).text

    threads = [threading.Thread(target=read, args=(index,)) for index in range(len(drafted_pages))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
