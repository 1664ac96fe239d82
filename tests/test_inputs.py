from pathlib import Path

from hsd_cli.document.inputs import assign_outputs, discover, sniff_kind


def test_sniffing_reads_content_not_names(tmp_path, docs_dir):
    fake = tmp_path / "fake.pdf"
    fake.write_text("just text")
    renamed = tmp_path / "scan.bin"
    renamed.write_bytes((docs_dir / "report.pdf").read_bytes())
    png = tmp_path / "page.dat"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    assert sniff_kind(fake) is None
    assert sniff_kind(renamed) == "pdf"
    assert sniff_kind(png) == "png"


def test_directories_globs_and_files_are_sorted_and_deduplicated(tmp_path, docs_dir):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.pdf").write_bytes((docs_dir / "report.pdf").read_bytes())
    (tmp_path / "b" / "c.pdf").write_bytes((docs_dir / "report.pdf").read_bytes())
    (tmp_path / "README.txt").write_text("not a document")
    (tmp_path / "broken.pdf").write_text("not a pdf either")
    found = discover([str(tmp_path), str(tmp_path / "a.pdf"), str(tmp_path / "*.pdf")], recursive=True)
    assert [str(d.relpath) for d in found.documents] == ["a.pdf", "b/c.pdf", "broken.pdf"]
    assert found.unmatched == [] and found.missing == []
    top_only = discover([str(tmp_path)], recursive=False).documents
    assert [str(d.relpath) for d in top_only] == ["a.pdf", "broken.pdf"]


def test_unmatched_patterns_and_missing_paths_are_told_apart(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "here.pdf").write_bytes(b"%PDF-1.7")
    named = [str(tmp_path / "missing.pdf"), str(tmp_path / "*.png"), str(tmp_path / "empty"), str(tmp_path / "gone")]
    found = discover(named, recursive=True, listed=[str(tmp_path / "here.pdf"), str(tmp_path / "listed.pdf")])
    assert [d.path.name for d in found.documents] == ["here.pdf"]
    assert found.unmatched == [str(tmp_path / "*.png"), str(tmp_path / "empty")]
    assert found.missing == [tmp_path / "gone", tmp_path / "listed.pdf", tmp_path / "missing.pdf"]


def test_files_from_entries_are_literal_paths(tmp_path):
    (tmp_path / "scan[1].pdf").write_bytes(b"%PDF-1.7")
    (tmp_path / "scan1.pdf").write_bytes(b"%PDF-1.7")
    listed = [str(tmp_path / "scan[1].pdf"), str(tmp_path / "page[12].pdf"), str(tmp_path / "*.pdf")]
    found = discover([], recursive=True, listed=listed)
    assert [d.path.name for d in found.documents] == ["scan[1].pdf"]
    assert found.missing == [tmp_path / "*.pdf", tmp_path / "page[12].pdf"] and found.unmatched == []
    as_argument = discover([str(tmp_path / "page[12].pdf")], recursive=True)
    assert as_argument.missing == [] and as_argument.unmatched == [str(tmp_path / "page[12].pdf")]


def test_outputs_mirror_the_tree_and_never_collide(tmp_path, docs_dir):
    for rel in ("x/a.pdf", "x/a.png", "y/a.pdf", "z/a.pdf"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"%PDF-1.7")
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.pdf").write_bytes(b"%PDF-1.7")
    docs = discover([str(tmp_path / "x"), str(tmp_path / "y" / "a.pdf"), str(other / "a.pdf")], recursive=True).documents
    outputs = assign_outputs(docs, Path("/out"))
    markdown = sorted(str(o.markdown) for o in outputs)
    assert markdown == ["/out/a.pdf-2.md", "/out/a.pdf-3.md", "/out/a.pdf.md", "/out/a.png.md"]
    assert len({o.json for o in outputs}) == len(outputs)
    single = discover([str(tmp_path / "z")], recursive=True).documents
    assert [str(o.markdown) for o in assign_outputs(single, Path("/out"))] == ["/out/a.md"]
