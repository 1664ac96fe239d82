"""Outputs get the mode the user's umask gives any new file, not the temp file's 0600."""

import os
import stat
from contextlib import contextmanager

import pymupdf
import pytest

from hsd_cli.output.files import write_atomic
from tests.conftest import run_hsd


@contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("mask", "expected"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)], ids=["umask022", "umask002", "umask077"]
)
def test_atomic_writes_follow_the_umask(tmp_path, mask, expected):
    """Markdown, JSON, figures and page checkpoints are all written by write_atomic."""
    target = tmp_path / "sub" / "page.md"
    with umask(mask):
        write_atomic(target, b"text")
        write_atomic(target, b"replaced")
    assert target.read_bytes() == b"replaced"
    assert _mode(target) == expected
    assert _mode(target.parent) == 0o777 & ~mask
    assert [p.name for p in target.parent.iterdir()] == ["page.md"]


def test_every_file_and_directory_of_a_run_gets_the_umask_mode(tmp_path, docs_dir):
    source = tmp_path / "in"
    (source / "sub").mkdir(parents=True)
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    page.insert_text((72, 72), "A page with a picture", fontsize=14)
    picture = pymupdf.open(docs_dir / "report.pdf")[0].get_pixmap(dpi=150)
    page.insert_image(pymupdf.Rect(72, 100, 400, 400), pixmap=picture)
    doc.save(source / "sub" / "figure.pdf")
    (source / "report.pdf").write_bytes((docs_dir / "report.pdf").read_bytes())
    out = tmp_path / "out"
    with umask(0o022):
        events = tmp_path / "events.ndjson"
        result = run_hsd("convert", source, "-o", out, "--pages", "1", "--draft", "pdf-text", "--events", events)
    assert result.exit_code == 0, result.stderr
    written = list(out.rglob("*"))
    files = [p for p in written if p.is_file()]
    names = {p.name for p in files}
    assert {"report.md", "report.json", "figure.md", "figure.json", "manifest.jsonl", "lock"} <= names
    assert any(p.suffix == ".png" for p in files), "the figure is saved"
    assert {str(p.relative_to(out)): oct(_mode(p)) for p in files if _mode(p) != 0o644} == {}
    dirs = [out, *(p for p in written if p.is_dir())]
    assert {".hsd", "sub", "figure_images"} <= {p.name for p in dirs}
    assert {str(p): oct(_mode(p)) for p in dirs if _mode(p) != 0o755} == {}
    assert _mode(tmp_path / "events.ndjson") == 0o644
