from pathlib import Path

import pytest

from tests import fixtures

_TABLE = "\n".join(
    ["| " + " | ".join(fixtures.TABLE_HEADER) + " |", "|---|---|---|"]
    + ["| " + " | ".join(row) + " |" for row in fixtures.TABLE_ROWS]
)
# What a VLM might have published for the two fixture pages (Markdown, its own conventions).
PAGE_OUTPUTS = (
    f"# {fixtures.TITLE}\n\n## {fixtures.SECTION}\n\n{fixtures.LEFT_COLUMN}\n\n{fixtures.RIGHT_COLUMN}\n\n"
    + "\n".join(f"- {item}" for item in fixtures.LIST_ITEMS) + "\n",
    f"## {fixtures.TABLE_SECTION}\n\n{_TABLE}\n",
)


@pytest.fixture(scope="session")
def replay_corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(inputs dir, outputs dir): the two-page fixture PDF and its published Markdown per page."""
    root = tmp_path_factory.mktemp("replay_corpus")
    (root / "in").mkdir()
    (root / "out").mkdir()
    fixtures.born_digital_pdf(root / "in" / "report.pdf")
    for page_no, text in enumerate(PAGE_OUTPUTS, start=1):
        (root / "out" / f"report_pg{page_no}_repeat1.md").write_text(text)
    return root / "in", root / "out"
