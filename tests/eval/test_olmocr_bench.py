"""olmOCR-Bench scoring: every test type passes and fails on hand-made pages, files and CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("olmocr.bench.tests", reason="needs the eval extra (olmocr and its scorer deps)")

from hsd_cli.eval import eval_app  # noqa: E402
from hsd_cli.eval.math_render import MathMode, find_browser, math_rendering  # noqa: E402
from hsd_cli.eval.olmocr_bench import BenchConfig, load_tests, run_test, score  # noqa: E402
from tests.conftest import run_hsd  # noqa: E402

NO_RENDERER = MathMode(katex=False, browser=None, reason="no KaTeX renderer: test")

TABLE_PAGE = """Results

| Model | Score | Year |
|---|---|---|
| Alpha | 0.91 | 2023 |
| Beta | 0.87 | 2024 |
"""

# (test fields, a page it passes on, a page it fails on)
CASES = {
    "present": (
        {"text": "The quick brown fox", "max_diffs": 1},
        "Intro. The **quick** brown fax jumps.",  # one edit away, emphasis removed
        "The slow grey wolf.",
    ),
    "absent": (
        {"text": "Page 12 of 40"},
        "Body text only.",
        "Body text.\n\nPage 12 of 40",
    ),
    "order": (
        {"before": "First column ends here", "after": "Second column starts here"},
        "First column ends here. Second column starts here.",
        "Second column starts here. First column ends here.",
    ),
    "table": (
        {"cell": "0.87", "up": "0.91", "left": "Beta", "top_heading": "Score"},
        TABLE_PAGE,
        TABLE_PAGE.replace("| Beta | 0.87 |", "| 0.87 | Beta |"),
    ),
    "math": (
        {"math": "E = mc^2"},
        "Energy: $E = mc^2$ holds.",
        "Energy: $E = m c^3$ holds.",
    ),
    "baseline": (
        {},
        "Some ordinary text on the page.",
        "",  # an empty page fails the baseline test
    ),
}


def _write_tests(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _test_row(kind: str, fields: dict, pdf: str = "doc.pdf", page: int = 1) -> dict:
    return {"pdf": pdf, "page": page, "id": f"{pdf}-{page}-{kind}", "type": kind, **fields}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_type_passes_and_fails(kind, tmp_path):
    fields, good, bad = CASES[kind]
    tests_file = _write_tests(tmp_path / "t.jsonl", [_test_row(kind, fields)])
    with math_rendering(NO_RENDERER):
        [(test, _)] = load_tests([tests_file])
        assert run_test(test, [good])[:2] == (1.0, True)
        score_bad, passed_bad, explanation = run_test(test, [bad])
    assert (score_bad, passed_bad) == (0.0, False)
    assert explanation


def test_blank_page_baseline_counts_characters(tmp_path):
    tests_file = _write_tests(tmp_path / "t.jsonl", [_test_row("baseline", {"max_length": 10})])
    with math_rendering(NO_RENDERER):
        [(test, _)] = load_tests([tests_file])
    assert run_test(test, ["p. 3"])[1] is True
    assert run_test(test, ["A page that is not blank at all"])[1] is False


def test_repeats_need_a_majority(tmp_path):
    fields, good, bad = CASES["present"]
    [(test, _)] = load_tests([_write_tests(tmp_path / "t.jsonl", [_test_row("present", fields)])])
    assert run_test(test, [good, good, bad])[:2] == (pytest.approx(2 / 3), True)
    assert run_test(test, [good, bad])[:2] == (0.5, False)  # 0.5 is not above half
    assert run_test(test, []) == (0.0, False, "no output for this page")


@pytest.mark.skipif(find_browser() is None, reason="no Chromium for KaTeX")
def test_katex_matches_another_spelling_of_the_same_formula(tmp_path):
    row = _test_row("math", {"math": r"\frac{a}{b}"})
    mode = MathMode(katex=True, browser=find_browser(), reason="test")
    with math_rendering(mode):
        [(test, _)] = load_tests([_write_tests(tmp_path / "t.jsonl", [row])])
        assert run_test(test, [r"$\frac a b$"])[1] is True
        assert run_test(test, [r"$\frac{b}{a}$"])[1] is False


def _hsd_document(path: Path, pages: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "schema": "hsd.document",
        "schema_version": 2,
        "page_count": len(pages),
        "pages": [{"page": i + 1, "markdown": text, "blocks": []} for i, text in enumerate(pages)],
    }
    path.write_text(json.dumps(document), encoding="utf-8")


@pytest.fixture
def suite(tmp_path) -> dict:
    """Two test files over two PDFs; outputs in both layouts that pass all but one test."""
    first = _write_tests(
        tmp_path / "a.jsonl",
        [
            _test_row("present", {"text": "alpha beta"}, "one.pdf", 1),
            _test_row("absent", {"text": "Footer"}, "one.pdf", 2),
            _test_row("present", {"text": "gamma delta"}, "sub/two.pdf", 1),
        ],
    )
    second = _write_tests(tmp_path / "b.jsonl", [_test_row("order", {"before": "alpha", "after": "beta"}, "one.pdf", 1)])
    pages = {("one", 1): "alpha beta", ("one", 2): "text Footer", ("sub/two", 1): "gamma delta"}
    hsd_out = tmp_path / "hsd"
    _hsd_document(hsd_out / "one.json", [pages[("one", 1)], pages[("one", 2)]])
    _hsd_document(hsd_out / "sub" / "two.json", [pages[("sub/two", 1)]])
    olmocr_out = tmp_path / "olmocr"
    for (key, page), text in pages.items():
        path = olmocr_out / f"{key}_pg{page}_repeat1.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {"tests": (first, second), "hsd": hsd_out, "olmocr": olmocr_out}


@pytest.mark.parametrize("layout", ["hsd", "olmocr"])
def test_scores_per_file_and_overall(suite, layout):
    report = score(BenchConfig(outputs=suite[layout], test_files=suite["tests"]), NO_RENDERER)
    # a.jsonl: 2 of 3 pass (the footer is present); b.jsonl: 1 of 1; baseline: 2 of 2 PDFs.
    assert report["by_file"]["a.jsonl"] == {"score": pytest.approx(2 / 3), "passed": 2, "total": 3, "unscored": 0}
    assert report["by_file"]["b.jsonl"]["score"] == 1.0
    assert report["by_file"]["baseline"] == {"score": 1.0, "passed": 2, "total": 2, "unscored": 0}
    assert report["overall"]["excludes"] is None
    assert report["overall"]["score"] == pytest.approx((2 / 3 + 1 + 1) / 3)
    low, high = report["overall"]["ci95"]
    assert 0.0 <= low <= report["overall"]["score"] <= high <= 1.0
    assert report["by_type"]["absent"]["passed"] == 0
    assert report["layout"] == ("olmocr-md" if layout == "olmocr" else "hsd-json")
    assert report["missing_pages"] == []


def test_missing_page_fails_its_tests(suite):
    (suite["hsd"] / "sub" / "two.json").unlink()
    report = score(BenchConfig(outputs=suite["hsd"], test_files=suite["tests"]), NO_RENDERER)
    assert report["missing_pages"] == ["sub/two.pdf#page=1"]
    assert report["by_pdf"]["sub/two.pdf"]["passed"] == 0


def test_agrees_with_olmocr_benchmark_evaluate_candidate(suite):
    benchmark = pytest.importorskip("olmocr.bench.benchmark", reason="olmocr's benchmark module needs pypdf")
    ours = score(BenchConfig(outputs=suite["olmocr"], test_files=suite["tests"], baseline=False), NO_RENDERER)
    with math_rendering(NO_RENDERER):
        tests = [test for test, _ in load_tests(suite["tests"])]
        official = benchmark.evaluate_candidate(str(suite["olmocr"]), tests, ["one.pdf", "sub/two.pdf"])
    official_passed = {t.id: passed for pages in official[6].values() for rows in pages.values() for t, passed, _ in rows}
    assert {row["id"]: row["passed"] for row in ours["tests"]} == official_passed


def test_cli_prints_only_json_on_stdout(suite):
    args = ["olmocr-bench", str(suite["hsd"]), "--math-render", "off", "--json"]
    for path in suite["tests"]:
        args += ["--tests", str(path)]
    result = CliRunner().invoke(eval_app, args)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["math_render"]["mode"] == "unscored"
    assert "--math-render off" in report["math_render"]["reason"]
    assert "warning" not in result.stderr  # off was asked for: nothing to warn about


@pytest.mark.parametrize(
    "problem",
    ["missing-outputs", "bad-json-line", "unknown-type", "missing-tests-file", "foreign-json-output"],
)
def test_bad_input_is_one_line_and_exit_2(problem, suite, tmp_path):
    tests_file, outputs = suite["tests"][0], suite["hsd"]
    if problem == "missing-outputs":
        outputs = tmp_path / "nowhere"
    elif problem == "bad-json-line":
        tests_file = tmp_path / "bad.jsonl"
        tests_file.write_text('{"pdf": "a.pdf", \n', encoding="utf-8")
    elif problem == "unknown-type":
        tests_file = _write_tests(tmp_path / "bad.jsonl", [_test_row("sparkle", {})])
    elif problem == "foreign-json-output":
        (outputs / "one.json").write_text('{"pages": "not ours"}', encoding="utf-8")
    else:
        tests_file = tmp_path / "absent.jsonl"
    result = CliRunner().invoke(
        eval_app, ["olmocr-bench", str(outputs), "--tests", str(tests_file), "--math-render", "off"]
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr


PAPER_PAGE = r"""# Results

First column ends here. Second column starts here.

Energy: $E = mc^2$, and the ratio $\frac a b$.

""" + TABLE_PAGE

NOTES_PAGE = "Handwritten notes about the quick brown fox.\n\nPage 3 of 9"

# (type, fields, pdf, passes under the official scorer) of dataset.jsonl; math needs KaTeX to judge.
MIXED_TESTS = [
    ("present", {"text": "Second column starts here"}, "paper.pdf", True),
    ("absent", {"text": "Page 12 of 40"}, "paper.pdf", True),
    ("order", {"before": "First column ends here", "after": "Second column starts here"}, "paper.pdf", True),
    ("table", {"cell": "0.87", "up": "0.91", "left": "Beta"}, "paper.pdf", True),
    ("table", {"cell": "0.91", "left": "Beta"}, "paper.pdf", False),
    ("math", {"math": "E = mc^2"}, "paper.pdf", True),  # written exactly so: still unscored unrendered
    ("math", {"math": r"\frac{a}{b}"}, "paper.pdf", True),  # another spelling: passes only rendered
    ("present", {"text": "quick brown fox"}, "notes.pdf", True),
    ("absent", {"text": "Page 3 of 9"}, "notes.pdf", False),
    ("math", {"math": "x^2"}, "notes.pdf", False),
]


@pytest.fixture
def mixed_bench(tmp_path) -> dict:
    """Two pages in olmOCR naming; dataset.jsonl with every type, math.jsonl with math only."""
    rows = [
        {**_test_row(kind, fields, pdf), "id": f"{pdf}-{number}-{kind}"}
        for number, (kind, fields, pdf, _) in enumerate(MIXED_TESTS)
    ]
    dataset = _write_tests(tmp_path / "dataset.jsonl", rows)
    math_only = _write_tests(tmp_path / "math.jsonl", [_test_row("math", {"math": r"\frac{b}{a}"}, "paper.pdf")])
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "paper_pg1_repeat1.md").write_text(PAPER_PAGE, encoding="utf-8")
    (outputs / "notes_pg1_repeat1.md").write_text(NOTES_PAGE, encoding="utf-8")
    args = ["eval", "olmocr-bench", outputs, "--tests", dataset, "--tests", math_only, "--json"]
    expected = {f"{pdf}-{number}-{kind}": passes for number, (kind, _, pdf, passes) in enumerate(MIXED_TESTS)}
    return {"args": args, "expected": expected}


@pytest.fixture
def hidden_renderer(monkeypatch):
    import hsd_cli.eval.math_render as math_render

    monkeypatch.setattr(math_render, "find_browser", lambda: None)


def test_without_a_renderer_math_is_unscored_and_left_out_of_the_overall(mixed_bench, hidden_renderer):
    result = run_hsd(*mixed_bench["args"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    reason = report["math_render"]["reason"]
    assert report["math_render"]["mode"] == "unscored" and "no KaTeX renderer: Chromium not found" in reason

    verdicts = {t["id"]: t["passed"] for t in report["tests"] if t["type"] not in ("math", "baseline")}
    assert verdicts == {key: passes for key, passes in mixed_bench["expected"].items() if "-math" not in key}
    assert all(t["passed"] is None and t["unscored"] == reason for t in report["tests"] if t["type"] == "math")

    by_type = {kind: (row["passed"], row["total"], row["unscored"]) for kind, row in report["by_type"].items()}
    assert by_type == {
        "present": (2, 2, 0), "absent": (1, 2, 0), "order": (1, 1, 0), "table": (1, 2, 0),
        "baseline": (2, 2, 0), "math": (0, 0, 4),
    }  # fmt: skip
    assert report["by_type"]["math"]["score"] is None and report["by_type"]["math"]["unscored_reason"] == reason
    assert report["by_file"]["dataset.jsonl"]["score"] == pytest.approx(5 / 7)
    assert report["by_file"]["math.jsonl"]["score"] is None  # nothing scored: no share in the overall
    assert report["overall"]["score"] == pytest.approx((5 / 7 + 1) / 2)
    assert report["overall"]["excludes"] == {"tests": 4, "by_type": {"math": 4}, "reason": reason}

    [math_row] = [line for line in result.stderr.splitlines() if "type math" in line]
    assert "unscored" in math_row and "(+4 unscored)" in math_row
    assert "excluding 4 unscored tests (4 math): no KaTeX renderer: Chromium not found" in result.stderr


def test_require_math_render_without_a_renderer_is_one_line_and_exit_4(mixed_bench, hidden_renderer):
    result = run_hsd(*mixed_bench["args"], "--require-math-render")
    assert result.exit_code == 4
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --require-math-render: no KaTeX renderer: Chromium not found")

    contradiction = run_hsd(*mixed_bench["args"], "--require-math-render", "--math-render", "off")
    assert contradiction.exit_code == 2 and "contradicts --math-render off" in contradiction.stderr


@pytest.mark.skipif(find_browser() is None, reason="no Chromium for KaTeX")
def test_with_a_renderer_math_is_scored_and_in_the_overall(mixed_bench):
    result = run_hsd(*mixed_bench["args"], "--require-math-render")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    math = {t["id"]: t["passed"] for t in report["tests"] if t["type"] == "math" and t["file"] == "dataset.jsonl"}
    assert math == {key: passes for key, passes in mixed_bench["expected"].items() if "-math" in key}
    assert report["by_type"]["math"] == {"score": 0.5, "passed": 2, "total": 4, "unscored": 0}
    assert report["overall"]["excludes"] is None
    assert report["overall"]["score"] == pytest.approx((7 / 10 + 0 + 1) / 3)


def test_olmocr_named_repeats_are_all_read(suite):
    extra = suite["olmocr"] / "sub" / "two_pg1_repeat2.md"
    extra.write_text("nothing useful", encoding="utf-8")
    report = score(BenchConfig(outputs=suite["olmocr"], test_files=suite["tests"]), NO_RENDERER)
    [gamma] = [t for t in report["tests"] if t["pdf"] == "sub/two.pdf" and t["type"] == "present"]
    assert (gamma["score"], gamma["passed"]) == (0.5, False)  # one of two repeats: not a majority
