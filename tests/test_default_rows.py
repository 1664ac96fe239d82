"""Rows in flight where --max-rows is not given (serving.rows): as many as a GPU's memory holds,
one on the CPU; the run says which, and its summary records them."""

import json
from dataclasses import replace

import pymupdf
import pytest
from PIL import Image

from hsd_cli.config import Executor, RunConfig
from tests.conftest import run_hsd


def test_rows_fill_the_devices_share_beside_weights_and_workspace_and_half_the_hosts_memory():
    from hsd_cli.serving.rows import (
        GIB,
        MAX_DEFAULT_ROWS,
        bounded,
        device_rows,
        host_rows,
    )

    # Qwen2.5-VL-7B in bf16 on an 80 GiB device: 16.6 GB of weights, rows of 7,000 tokens at 57,344 bytes.
    row = 7_000 * 57_344
    rows = device_rows(80 * GIB, 16_584_333_648, row)
    assert rows == int((80 * GIB * 0.9 - 16_584_333_648 - 4 * GIB) // row) == 140
    assert device_rows(120 * GIB, 16_584_333_648, row) == 236, "the weights are paid once: 40 GiB more, 96 rows more"
    assert host_rows(16 * GIB) == 32, "half of 16 GiB holds 32 documents"
    assert bounded(device_rows(16 * GIB, 16_584_333_648, row)) == 1, "a model that barely fits still reads, one row"
    assert bounded(device_rows(1024 * GIB, 1, row), host_rows(4096 * GIB)) == MAX_DEFAULT_ROWS
    assert bounded(rows, host_rows(16 * GIB)) == 32 and bounded(rows, host_rows(1024 * GIB)) == 140


def test_on_the_cpu_the_default_is_one_row_and_nothing_is_loaded():
    from hsd_cli.serving.rows import a4_page
    from hsd_cli.config import ModelConfig
    from hsd_cli.serving.rows import device_rows_choice

    model = ModelConfig("no/such-model", "qwen2_5_vl", "cpu", "float32", False, 64, False, None)
    choice = device_rows_choice(model, a4_page(150, 40_000_000))
    assert choice.rows == 1 and "CPU" in choice.why


def test_on_a_gpu_the_rows_follow_its_memory_and_the_pages_prompt(tiny_model, monkeypatch):
    """The budget on a device of a given size (its memory stands in for a GPU's), priced with the
    model's own footprint and the prompt its processor makes of an A4 page at the render size."""
    from hsd_cli import processes
    from hsd_cli.decoding.hf_target import footprint, load_target
    from hsd_cli.models.family_settings import settings_for
    from hsd_cli.config import ModelConfig
    from hsd_cli.serving.rows import A4_PT, a4_page
    from hsd_cli.serving.rows import GIB, WORKSPACE_BYTES, device_rows_choice

    def default_rows(options, dpi, max_pixels):
        return device_rows_choice(options, a4_page(dpi, max_pixels))

    target = load_target(str(tiny_model), device="cpu", dtype="float32")
    page = Image.new("RGB", (round(A4_PT[0] * 100 / 72), round(A4_PT[1] * 100 / 72)), "white")
    prompt = settings_for(target.model_type).page_prompt
    tokens = target.inputs([page], [prompt])["input_ids"].shape[-1] + 64
    row = tokens * footprint.kv_bytes_per_token(target.model.config, 4)
    weights = footprint.model_footprint(target.model.config, "float32").weight_bytes
    device = int((WORKSPACE_BYTES + weights + 37.5 * row) / 0.9)  # room for 37 rows and a half
    monkeypatch.setattr(footprint, "device_memory", lambda name: device if name == "cuda" else None)
    monkeypatch.setattr(processes, "available_memory", lambda: None)
    options = ModelConfig(str(tiny_model), target.model_type, "cuda", "float32", False, 64, False, None)
    choice = default_rows(options, dpi=100, max_pixels=40_000_000)
    assert choice.rows == 37
    assert f"hold 37 rows of {tokens:,} tokens" in choice.why
    assert default_rows(replace(options, max_new_tokens=6400), dpi=100, max_pixels=40_000_000).rows < 37, "longer rows"
    monkeypatch.setattr(processes, "available_memory", lambda: 4 * GIB)
    small_host = default_rows(options, dpi=100, max_pixels=40_000_000)
    assert small_host.rows == 8 and "half the host's 4 GiB available, 8 documents" in small_host.why
    monkeypatch.setattr(processes, "available_memory", lambda: None)

    asked = []
    measure = footprint.prompt_tokens
    monkeypatch.setattr(footprint, "prompt_tokens", lambda model, family, image, *rest: asked.append(image.size) or measure(model, family, image, *rest))
    default_rows(options, dpi=200, max_pixels=40_000_000)
    default_rows(options, dpi=400, max_pixels=page.width * page.height)
    assert asked[0] == (round(A4_PT[0] * 200 / 72), round(A4_PT[1] * 200 / 72)), "the page at the run's dpi"
    assert abs(asked[1][0] - page.width) <= 1 and abs(asked[1][1] - page.height) <= 1, "--max-pixels caps it"


@pytest.mark.slow
def test_max_rows_unset_is_chosen_and_recorded(tiny_model, docs_dir, tmp_path):
    assert RunConfig().max_rows is None
    RunConfig(executor=Executor.RAY)  # unset is one row there: no refusal
    chosen = run_hsd("convert", docs_dir, "-o", tmp_path / "a", "--model", tiny_model, "--json",
                     "--max-new-tokens", "8", "--device", "cpu", "--events", tmp_path / "a.ndjson")
    assert chosen.exit_code == 0, chosen.stderr
    assert json.loads(chosen.stdout)["max_rows"] == 1
    started = json.loads((tmp_path / "a.ndjson").read_text().splitlines()[0])
    assert started["event"] == "run_started" and started["max_rows"] == 1
    assert "rows in flight: 1 (the model runs on the CPU" in chosen.stderr
    given = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "b", "--model", tiny_model, "--json",
                    "--max-new-tokens", "8", "--max-rows", "2")
    assert given.exit_code == 0, given.stderr
    assert json.loads(given.stdout)["max_rows"] == 2
    assert "rows in flight" not in given.stderr, "a value given is not announced"
    draft_only = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "c", "--json", "-q")
    assert json.loads(draft_only.stdout)["max_rows"] == 1


@pytest.mark.slow
def test_a_budget_that_cannot_be_worked_out_warns_and_reads_one_row(tiny_model, docs_dir, tmp_path, monkeypatch):
    from hsd_cli.decoding.hf_target import footprint

    monkeypatch.setattr(footprint, "device_memory", lambda name: 80 << 30)

    def broken(*args, **kwargs):
        raise OSError("no preprocessor_config.json")

    monkeypatch.setattr(footprint, "prompt_tokens", broken)
    result = run_hsd("convert", docs_dir, "-o", tmp_path / "a", "--model", tiny_model, "--json",
                     "--max-new-tokens", "8", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert "cannot budget the rows in flight (OSError: no preprocessor_config.json); one row" in result.stderr
    assert json.loads(result.stdout)["max_rows"] == 1


@pytest.mark.slow
def test_on_a_gpu_a_run_keeps_no_more_rows_than_it_has_documents(tiny_model, docs_dir, tmp_path, monkeypatch):
    """Per-page sizing prices each read at the rows: a run of two documents on a device that
    holds many reads as two rows, and one document as one (whole trees, as against `generate`).
    The CPU's memory as the parent sees it stands in for a GPU's; the worker runs on the CPU."""
    from hsd_cli import processes
    from hsd_cli.decoding.hf_target import footprint

    monkeypatch.setattr(footprint, "device_memory", lambda name: 80 << 30)
    monkeypatch.setattr(processes, "available_memory", lambda: None)
    both = run_hsd("convert", docs_dir, "-o", tmp_path / "both", "--model", tiny_model, "--json", "--max-new-tokens", "8")
    assert both.exit_code == 0, both.stderr
    assert json.loads(both.stdout)["max_rows"] == 2
    assert "rows in flight: 2, one per document (cpu's 80 GiB hold " in both.stderr
    one = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "one", "--model", tiny_model, "--json", "--max-new-tokens", "8")
    assert one.exit_code == 0, one.stderr
    assert json.loads(one.stdout)["max_rows"] == 1 and "rows in flight: 1, one per document (cpu's" in one.stderr


@pytest.mark.slow
def test_on_a_gpu_a_long_document_splits_into_as_many_rows_as_its_parts(tiny_model, docs_dir, tmp_path, monkeypatch):
    """One long PDF alone in a run fills rows too: it splits into parts of at least MIN_PART_PAGES
    pages, a row each (20 pages: 3 parts), and `--pages` counts only the pages selected."""
    from hsd_cli import processes
    from hsd_cli.decoding.hf_target import footprint

    monkeypatch.setattr(footprint, "device_memory", lambda name: 80 << 30)
    monkeypatch.setattr(processes, "available_memory", lambda: None)
    long_pdf = tmp_path / "long.pdf"
    with pymupdf.open(docs_dir / "report.pdf") as report, pymupdf.open() as long:
        for _ in range(10):
            long.insert_pdf(report)
        long.save(long_pdf)
    events = tmp_path / "events.ndjson"
    split = run_hsd("convert", long_pdf, "-o", tmp_path / "split", "--model", tiny_model, "--json",
                    "--max-new-tokens", "8", "--stages", "page", "--events", events)
    assert split.exit_code == 0, split.stderr
    assert json.loads(split.stdout)["max_rows"] == 3
    assert "rows in flight: 3, one per document part of 8+ pages (cpu's 80 GiB hold " in split.stderr
    order = [(event["event"], event.get("page")) for event in map(json.loads, events.read_text().splitlines())]
    # One at a time, a page starts after the one before it is done; split, pages 9 and 17 open parts.
    assert order.index(("page_started", 9)) < order.index(("page_done", 8))
    assert order.index(("page_started", 17)) < order.index(("page_done", 16))
    eight = run_hsd("convert", long_pdf, "-o", tmp_path / "eight", "--model", tiny_model, "--json",
                    "--max-new-tokens", "8", "--stages", "page", "--pages", "1-8")
    assert eight.exit_code == 0, eight.stderr
    assert json.loads(eight.stdout)["max_rows"] == 1


def test_the_parts_a_run_splits_into_count_pages_selected_and_stop_when_enough(docs_dir, tmp_path):
    from hsd_cli.serving.rows import run_parts

    report = (docs_dir / "report.pdf", "pdf")  # 2 pages
    broken = tmp_path / "broken.pdf"
    broken.write_text("not a pdf")
    with pymupdf.open(docs_dir / "report.pdf") as two, pymupdf.open() as long:
        for _ in range(9):
            long.insert_pdf(two)
        long.save(tmp_path / "long.pdf")  # 18 pages: 3 parts
    long = (tmp_path / "long.pdf", "pdf")
    assert run_parts([report, (broken, "pdf"), long], None, None, 256) == 5, "a broken file counts one"
    assert run_parts([long], "1-16", None, 256) == 2 and run_parts([long], "3", None, 256) == 1
    assert run_parts([long, long, long], None, None, 4) == 4, "counted up to the rows the device holds"


def test_a_worker_process_serves_max_docs_per_worker_per_row_in_flight(tmp_path):
    """A process due drains its rows and the next loads the model again: with N rows it is due
    after N times --max-docs-per-worker documents, so a generation pays that once per as many
    documents per row as with one row."""
    from hsd_cli.batch.reporting import EventLog, Reporter
    from hsd_cli.batch.runner import BatchRun, open_executor
    from hsd_cli.config import ConvertConfig, ModelConfig
    from tests.fixtures import resolved

    with_model = ConvertConfig(output_dir=tmp_path, model="some/model")
    model = ModelConfig("some/model", "qwen2_5_vl", "cpu", "float32", False, 64, False, None)
    draft_only = ConvertConfig(output_dir=tmp_path)
    run = RunConfig(max_rows=4, max_docs_per_worker=5)
    assert resolved(with_model, model, run).schedule.docs_per_worker == 20
    assert resolved(draft_only, None, run).schedule.docs_per_worker == 5, "without a model one document is in flight"
    executor = open_executor(with_model, run, resolved(with_model, model, run))
    assert (executor.slots, executor.max_docs_per_worker) == (4, 20)
    batch = BatchRun(with_model, run, resolved(with_model, model, run), Reporter(console=None), EventLog(None))
    assert batch.limits.max_docs_per_worker == 20, "the pools recycle by the same count"
