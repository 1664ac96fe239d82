"""Find the documents a run works on and where each one's outputs go."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

DOCUMENT_SUFFIXES = {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff"}

# Magic bytes: PDF may have junk before the header (readers accept it within the first KiB).
_IMAGE_MAGIC = {
    b"\x89PNG\r\n\x1a\n": "png",
    b"\xff\xd8\xff": "jpeg",
    b"II*\x00": "tiff",
    b"MM\x00*": "tiff",
}


def sniff_kind(path: Path) -> str | None:
    """'pdf', 'png', 'jpeg', 'tiff' from the file's content, or None if it is none of these."""
    try:
        with path.open("rb") as handle:
            head = handle.read(1024)
    except OSError:
        return None
    if b"%PDF-" in head:
        return "pdf"
    for magic, kind in _IMAGE_MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


@dataclass(frozen=True)
class InputDocument:
    path: Path
    relpath: Path  # where it sits under its input root; the output mirrors this
    kind: str | None  # sniffed content kind; None = not a document we can read


@dataclass(frozen=True)
class OutputPaths:
    markdown: Path
    json: Path
    images_dir: Path


def _walk(root: Path, recursive: bool) -> list[Path]:
    if recursive:
        found = [Path(d) / name for d, _, names in os.walk(root) for name in names]
    else:
        found = [p for p in root.iterdir() if p.is_file()]
    return [p for p in found if not any(part.startswith(".") for part in p.relative_to(root).parts)]


def _glob_root(pattern: str) -> Path:
    """The directory part of a glob pattern before its first wildcard."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


@dataclass(frozen=True)
class Discovery:
    documents: list[InputDocument]  # sorted, de-duplicated
    unmatched: list[str]  # directories and globs in which no document was found
    missing: list[Path]  # paths the user named that do not exist: failed inputs, not warnings


def discover(inputs: list[str], recursive: bool, listed: list[str] | None = None) -> Discovery:
    """Expand files, directories and globs into sorted, de-duplicated documents.

    Explicit files are always taken (a bad one becomes a status later). Inside directories and
    globs a file is taken when its content or its suffix says it is a document, so a stray
    README is ignored but a broken `scan.pdf` is reported. `listed` holds --files-from entries:
    paths taken literally, never expanded as globs.
    """
    found: dict[Path, InputDocument] = {}
    unmatched: list[str] = []
    missing: dict[Path, Path] = {}

    def add(path: Path, root: Path | None, explicit: bool) -> bool:
        """Take `path` if it is (or claims to be) a document; True when it is one."""
        kind = sniff_kind(path)
        if not explicit and kind is None and path.suffix.lower() not in DOCUMENT_SUFFIXES:
            return False
        resolved = path.resolve()
        if resolved in found:
            return True
        relpath = Path(path.name) if root is None else path.relative_to(root)
        found[resolved] = InputDocument(path=path, relpath=relpath, kind=kind)
        return True

    named = [(arg, False) for arg in inputs] + [(entry, True) for entry in listed or []]
    for arg, literal in named:
        path = Path(arg)
        if path.is_dir():
            taken = [add(child, path, explicit=False) for child in sorted(_walk(path, recursive))]
            if not any(taken):
                unmatched.append(arg)
        elif path.is_file():
            add(path, None, explicit=True)
        elif glob.has_magic(arg) and not literal:
            root = _glob_root(arg)
            matches = sorted(Path(m) for m in glob.glob(arg, recursive=True) if Path(m).is_file())
            taken = [add(match, root, explicit=False) for match in matches]
            if not any(taken):
                unmatched.append(arg)
        elif not path.exists():
            missing.setdefault(path.absolute(), path)
        else:
            unmatched.append(arg)  # a device or socket: nothing to read as a document
    documents = sorted(found.values(), key=lambda d: (str(d.relpath), str(d.path)))
    return Discovery(documents, unmatched, sorted(missing.values(), key=str))


def assign_outputs(documents: list[InputDocument], output_dir: Path) -> list[OutputPaths]:
    """Output paths mirroring each document's relpath, never two documents on one path.

    `a.pdf` -> `a.md`; if `a.pdf` and `a.png` sit side by side both keep their suffix
    (`a.pdf.md`, `a.png.md`); remaining clashes (same name from two roots) get `-2`, `-3`.
    """
    def base(relpath: Path, keep_suffix: bool) -> Path:
        return relpath.parent / (relpath.name if keep_suffix else relpath.stem)

    stems: dict[Path, int] = {}
    for doc in documents:
        key = base(doc.relpath, False)
        stems[key] = stems.get(key, 0) + 1
    taken: set[Path] = set()
    assigned: list[OutputPaths] = []
    for doc in documents:
        stem = base(doc.relpath, stems[base(doc.relpath, False)] > 1)
        candidate, n = stem, 1
        while candidate in taken:
            n += 1
            candidate = stem.with_name(f"{stem.name}-{n}")
        taken.add(candidate)
        target = output_dir / candidate
        assigned.append(
            OutputPaths(
                markdown=target.with_name(target.name + ".md"),
                json=target.with_name(target.name + ".json"),
                images_dir=target.with_name(target.name + "_images"),
            )
        )
    return assigned
