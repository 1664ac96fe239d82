"""Memory: the parent stays free of the models, the worker gives freed memory back after each page, and every
document reports the worker's peak memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, uses glibc")


def _python(code: str, *args: str, timeout: int = 120) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_parent_converts_without_loading_any_model_library(docs_dir, tmp_path):
    """The models live in the worker: a draft-only run's parent never imports them (it was 330 MB)."""
    report = _python(
        """
        import json, sys
        from typer.testing import CliRunner
        from hsd_cli.cli import app

        result = CliRunner().invoke(app, ["convert", sys.argv[1], "-o", sys.argv[2], "-q", "--json"])
        assert result.exit_code == 0, result.output
        heavy = ("pymupdf", "fitz", "onnxruntime", "rapidocr", "torch", "transformers", "cv2")
        loaded = sorted(name for name in heavy if name in sys.modules)
        print(json.dumps({"loaded": loaded, "summary": json.loads(result.stdout)}))
        """,
        str(docs_dir / "report.pdf"),
        str(tmp_path / "out"),
    )
    report = json.loads(report)
    assert report["loaded"] == []
    assert (tmp_path / "out" / "report.md").read_text().strip()
    if sys.platform.startswith("linux"):
        peaks = report["summary"]["peak_rss_mib"]
        assert peaks["parent"] < peaks["worker"]  # measured where the models are


def test_a_draft_only_worker_does_not_import_torch(docs_dir, tmp_path):
    """What a worker runs for one document, with no VLM: torch and transformers stay out (180 MiB)."""
    loaded = _python(
        """
        import json, sys
        from pathlib import Path
        from hsd_cli.document.inputs import assign_outputs, discover
        from hsd_cli.batch.resolve import resolve_schedule
        from hsd_cli.document.tasks import DocumentTask
        from hsd_cli.config import ConvertConfig, ResolvedConfig, RunConfig
        from hsd_cli.document.writing import process_document

        out = Path(sys.argv[2])
        docs = discover([sys.argv[1]], False).documents
        config = ConvertConfig(output_dir=out)
        resolved = ResolvedConfig(config.document, None, resolve_schedule(config, None, RunConfig(), None, []))
        task = DocumentTask(
            doc=docs[0], outputs=assign_outputs(docs, out)[0], config=resolved,
            sha256="0" * 64, checkpoint_dir=out / "checkpoints",
        )
        outcome = process_document(task, lambda name, payload: None)
        assert outcome.status.value == "ok", outcome.error
        print(json.dumps(sorted(name for name in ("torch", "transformers") if name in sys.modules)))
        """,
        str(docs_dir / "report.pdf"),
        str(tmp_path / "out"),
    )
    assert json.loads(loaded) == []


@linux_only
def test_memory_freed_by_a_page_goes_back_to_the_os():
    """After a 24 MiB block is freed glibc serves 8 MiB blocks from the heap, and smaller live
    blocks between them keep that heap from shrinking: what the worker does after each page
    gives their pages back."""
    retained = _python(
        """
        import ctypes
        from hsd_cli.document.drafting import release_freed_memory

        def rss_mib():
            with open("/proc/self/status") as handle:
                return next(int(line.split()[1]) // 1024 for line in handle if line.startswith("VmRSS:"))

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        large = libc.malloc(24 << 20)
        ctypes.memset(large, 1, 24 << 20)
        libc.free(large)
        before = rss_mib()
        blocks, pins = [], []
        for _ in range(20):
            block = libc.malloc(8 << 20)
            ctypes.memset(block, 1, 8 << 20)
            blocks.append(block)
            pins.append(libc.malloc(200 << 10))
        for block in blocks:
            libc.free(block)
        release_freed_memory()
        print(rss_mib() - before)
        """
    )
    assert int(retained) < 40  # 160 MiB stay resident under glibc's default


@linux_only
def test_every_document_reports_the_worker_peak_memory(converted):
    summary = converted["summary"]
    manifest = [
        json.loads(line) for line in (converted["out"] / ".hsd" / "manifest.jsonl").read_text().splitlines()
    ]
    peaks = [document["peak_rss_mib"] for document in summary["documents"]]
    assert peaks and all(isinstance(peak, int) for peak in peaks)
    assert sorted(record["stats"]["peak_rss_mib"] for record in manifest) == sorted(peaks)
    assert summary["peak_rss_mib"]["worker"] == max(peaks)
    assert isinstance(summary["peak_rss_mib"]["parent"], int)


def test_a_documents_figures_wait_for_its_files_on_disk_not_in_memory(tmp_path):
    """A long document streams: the pages it holds until it is written keep no figure crops (they
    are read back from the page checkpoints), and every figure still reaches the output."""
    from pathlib import Path

    import pymupdf

    from hsd_cli.config import ConvertConfig, DraftBackendName
    from hsd_cli.document.inputs import InputDocument, OutputPaths
    from hsd_cli.document.pipeline import convert_document
    from hsd_cli.document.writing import write_document
    from tests.fixtures import resolved
    from hsd_cli.document.tasks import DocumentTask

    picture = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 200, 150), False)
    picture.set_rect(picture.irect, (40, 120, 200))
    pdf = tmp_path / "figures.pdf"
    with pymupdf.open() as doc:
        for number in range(1, 4):
            page = doc.new_page(width=595, height=842)
            page.insert_text((72, 72), f"Page {number} has a picture", fontsize=14)
            page.insert_image(pymupdf.Rect(72, 100, 400, 350), pixmap=picture)
        doc.save(pdf)
    outputs = OutputPaths(markdown=tmp_path / "figures.md", json=tmp_path / "figures.json", images_dir=tmp_path / "figures_images")
    task = DocumentTask(
        doc=InputDocument(path=pdf, relpath=Path("figures.pdf"), kind="pdf"), outputs=outputs,
        config=resolved(ConvertConfig(output_dir=tmp_path, draft_backend=DraftBackendName.PDF_TEXT)), sha256="0",
        checkpoint_dir=tmp_path / "checkpoints",
    )
    result, failures = convert_document(task, lambda name, payload: None)
    assert not failures and len(result.pages) == 3
    assert all(page.figures == () for page in result.pages), "figure crops held in memory"
    write_document(result, task)
    written = sorted(outputs.images_dir.iterdir())
    assert len(written) == 3 and all(path.read_bytes().startswith(b"\x89PNG") for path in written)
    markdown = outputs.markdown.read_text()
    assert all(f"figures_images/{path.name}" in markdown for path in written)


LONG_DOCUMENT_PAGES = 300
# Measured 5 KiB a page (MuPDF's and the heap's noise) over pages 50-300; a page's figure crops held
# to the document's end added 864 KiB a page.
MAX_GROWTH_KIB_PER_PAGE = 100


def _least_squares_slope(values: list[int]) -> float:
    mean_x, mean_y = (len(values) - 1) / 2, sum(values) / len(values)
    spread = sum((x - mean_x) ** 2 for x in range(len(values)))
    return sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread


@linux_only
@pytest.mark.slow
def test_a_long_documents_worker_memory_does_not_grow_with_its_pages(tmp_path):
    """The worker's resident memory after each page of a 300-page document with a picture on every
    page: past a warm-up its slope stays near zero (pages and their figures stream to checkpoints
    and files, BENCHMARKS "Memory and long documents")."""
    rss_after_each_page = _python(
        """
        import json, sys
        from pathlib import Path
        import pymupdf
        from hsd_cli.config import ConvertConfig, DraftBackendName
        from hsd_cli.document.inputs import InputDocument, OutputPaths
        from hsd_cli.document.tasks import DocumentTask
        from hsd_cli.batch.resolve import resolve_schedule
        from hsd_cli.config import ResolvedConfig, RunConfig
        from hsd_cli.document.writing import process_document

        root, pages = Path(sys.argv[1]), int(sys.argv[2])
        picture = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 200, 150), False)
        picture.set_rect(picture.irect, (40, 120, 200))
        pdf = root / "long.pdf"
        with pymupdf.open() as doc:
            for number in range(1, pages + 1):
                page = doc.new_page(width=300, height=300)
                page.insert_text((20, 30), f"Page {number} has a picture", fontsize=10)
                page.insert_image(pymupdf.Rect(20, 50, 280, 280), pixmap=picture)
            doc.save(pdf)

        def rss_kib():
            with open("/proc/self/status") as handle:
                return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))

        rss = []
        # The run as the parent resolves it (the subprocess sees the installed package, not the tests).
        options = ConvertConfig(output_dir=root, draft_backend=DraftBackendName.PDF_TEXT)
        outputs = OutputPaths(markdown=root / "long.md", json=root / "long.json", images_dir=root / "long_images")
        task = DocumentTask(
            doc=InputDocument(path=pdf, relpath=Path("long.pdf"), kind="pdf"), outputs=outputs,
            config=ResolvedConfig(options.document, None, resolve_schedule(options, None, RunConfig(), None, [])), sha256="0",
            checkpoint_dir=root / "checkpoints",
        )
        outcome = process_document(task, lambda name, payload: rss.append(rss_kib()) if name == "page_done" else None)
        assert outcome.status.value == "ok", outcome.error
        assert len(list((root / "long_images").iterdir())) == pages, "every page's figure written"
        print(json.dumps(rss))
        """,
        str(tmp_path),
        str(LONG_DOCUMENT_PAGES),
        timeout=600,
    )
    rss = json.loads(rss_after_each_page)
    assert len(rss) == LONG_DOCUMENT_PAGES
    slope = _least_squares_slope(rss[50:])  # the first pages load MuPDF's fonts and the heap's arenas
    assert slope < MAX_GROWTH_KIB_PER_PAGE, f"the worker grew {slope:.0f} KiB a page"
