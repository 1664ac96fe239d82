"""Per-page Markdown of a converted document, from hsd's JSON or from olmOCR-style files.

Two layouts are read:
* hsd: `OUT/<relpath>/<stem>.json` (schema `hsd.document`), one `pages[].markdown` per page;
* olmOCR-Bench candidates: `OUT/<relpath>/<stem>_pg<page>_repeat<N>.md`, one file per page
  and repeated run, which is how olmOCR's published outputs are named.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hsd_cli.eval.errors import EvalInputError

_REPEAT_FILE = re.compile(r"^(?P<base>.+)_pg(?P<page>\d+)_repeat(?P<repeat>\d+)\.md$")


def document_key(relpath: str) -> str:
    """'sub/doc.pdf' -> 'sub/doc': how an input maps to its output name under OUT."""
    path = Path(relpath)
    return path.with_suffix("").as_posix()


@dataclass
class PageOutputs:
    """Lazily indexed outputs under one directory; `markdown(key, page)` gives every repeat."""

    root: Path
    _repeats: dict[tuple[str, int], list[Path]] = field(default_factory=dict)
    _documents: dict[str, dict[int, str] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.root.is_dir():
            raise EvalInputError(f"output directory not found: {self.root}")
        for path in sorted(self.root.rglob("*.md")):
            match = _REPEAT_FILE.match(path.relative_to(self.root).as_posix())
            if match:
                key = (match["base"], int(match["page"]))
                self._repeats.setdefault(key, []).append(path)

    @property
    def layout(self) -> str:
        return "olmocr-md" if self._repeats else "hsd-json"

    def markdown(self, key: str, page: int) -> list[str]:
        """The page's Markdown once per repeat; empty when the output has no such page."""
        repeats = self._repeats.get((key, page))
        if repeats:
            return [path.read_text(encoding="utf-8", errors="replace") for path in repeats]
        pages = self._document_pages(key)
        if pages is None or page not in pages:
            return []
        return [pages[page]]

    def _document_pages(self, key: str) -> dict[int, str] | None:
        if key not in self._documents:
            self._documents[key] = read_hsd_pages(self.root / f"{key}.json")
        return self._documents[key]


def read_hsd_pages(path: Path) -> dict[int, str] | None:
    """{1-based page: Markdown} from an hsd JSON file; None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvalInputError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("schema") != "hsd.document":
        raise EvalInputError(f"{path}: not an hsd.document JSON file")
    try:
        return {int(page["page"]): str(page.get("markdown") or "") for page in document["pages"]}
    except (KeyError, TypeError, ValueError):
        raise EvalInputError(f"{path}: malformed 'pages' list") from None
