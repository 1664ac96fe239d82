"""olmOCR-Bench scoring with olmocr's own test classes (`olmocr.bench.tests`).

The test semantics (normalisation, fuzzy matching, table neighbours, KaTeX math, baseline) are
olmocr's code, imported, not rewritten. This module only does what `olmocr.bench.benchmark`
does around them: find each page's Markdown, run every test on every repeat, count a test as
passed when more than half of the repeats pass, add a `baseline` test for every PDF that has
none, and score = mean over test files of the share of their tests that pass, with a bootstrap
interval that resamples within each file. Differences from benchmark.py: a missing page fails
its tests instead of failing the whole candidate, the bootstrap is seeded, and without a KaTeX
renderer math tests are unscored (left out of every score, the report says why), where
benchmark.py cannot even load them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsd_cli.eval.errors import EvalInputError, missing_dependency
from hsd_cli.eval.math_render import MathMode, math_rendering
from hsd_cli.eval.outputs import PageOutputs, document_key

BASELINE_FILE = "baseline"  # olmocr's name for the group of added baseline tests
MISSING_PAGE = "no output for this page"


def import_bench():
    """olmocr's bench modules, or a usage error naming the install that brings them."""
    try:
        import lxml  # noqa: F401  olmocr's MathML comparison parses with BeautifulSoup's "xml" (lxml)
        import olmocr.bench.tests as bench_tests
        import olmocr.bench.utils as bench_utils
    except ImportError as exc:
        raise missing_dependency(exc, "olmOCR-Bench scoring") from None
    return bench_tests, bench_utils


@dataclass(frozen=True)
class BenchConfig:
    outputs: Path
    test_files: tuple[Path, ...]
    pdfs: Path | None = None  # every PDF here gets a baseline test, as in olmocr's benchmark
    baseline: bool = True
    bootstrap_samples: int = 1000
    seed: int = 0


@dataclass(frozen=True)
class ScoredTest:
    test: Any  # an olmocr.bench.tests.BasePDFTest
    file: str
    score: float | None  # share of repeats that passed; None when unscored
    passed: bool | None
    explanation: str
    unscored: str | None = None  # why the test has no verdict

    @property
    def scored(self) -> bool:
        return self.unscored is None


def load_tests(test_files: Iterable[Path]) -> list[tuple[Any, str]]:
    """(olmocr test, source file name) for every line; errors name the file and line."""
    bench_tests, _ = import_bench()
    loaded: list[tuple[Any, str]] = []
    seen: dict[str, str] = {}
    for path in test_files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise EvalInputError(f"cannot read test file {path}: {exc.strerror or exc}") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                test = bench_tests.load_single_test(json.loads(line))
            except (ValueError, TypeError, KeyError, bench_tests.ValidationError) as exc:
                raise EvalInputError(f"{path}:{number}: not a valid olmOCR-Bench test ({exc})") from None
            if test.id in seen:
                raise EvalInputError(f"{path}:{number}: duplicate test id {test.id!r} (also in {seen[test.id]})")
            seen[test.id] = path.name
            loaded.append((test, path.name))
    if not loaded:
        raise EvalInputError("the test files hold no tests")
    return loaded


def add_baseline_tests(tests: list[tuple[Any, str]], pdf_names: Iterable[str]) -> list[tuple[Any, str]]:
    """benchmark.py's rule: every PDF without a baseline test gets one on page 1."""
    bench_tests, _ = import_bench()
    with_baseline = {test.pdf for test, _ in tests if test.type == "baseline"}
    added = [
        (bench_tests.BaselineTest(id=f"{pdf}_baseline", pdf=pdf, page=1, type="baseline"), BASELINE_FILE)
        for pdf in pdf_names
        if pdf not in with_baseline
    ]
    return tests + added


def run_test(test: Any, repeats: list[str]) -> tuple[float, bool, str]:
    """(share of repeats passed, passed, first failure explanation) as in benchmark.py."""
    if not repeats:
        return 0.0, False, MISSING_PAGE
    passes = 0
    explanations: list[str] = []
    for markdown in repeats:
        try:
            passed, explanation = test.run(markdown)
        except Exception as exc:  # benchmark.py counts a crashing test as a failed repeat
            passed, explanation = False, f"test raised {type(exc).__name__}: {exc}"
        if passed:
            passes += 1
        else:
            explanations.append(explanation)
    score = passes / len(repeats)
    return score, score > 0.5, explanations[0] if explanations else ""


def unscored_reason(test: Any, math_mode: MathMode) -> str | None:
    """Why `test` gets no verdict in this run, or None when it is scored.

    Without a KaTeX renderer every math test is unscored, an exact LaTeX match included. That
    match is a pass the official scorer also gives, but counting it would count only tests that
    pass (every other verdict needs the renderer), so the math figure and the overall would be
    neither the benchmark's nor a clean exclusion.
    """
    if test.type == "math" and not math_mode.katex:
        return math_mode.reason
    return None


def judge(test: Any, file: str, outputs: PageOutputs, math_mode: MathMode) -> ScoredTest:
    """The test's verdict on its page's repeats, or why it has none."""
    reason = unscored_reason(test, math_mode)
    if reason is not None:
        return ScoredTest(test, file, None, None, "", unscored=reason)
    return ScoredTest(test, file, *run_test(test, outputs.markdown(document_key(test.pdf), test.page)))


def pdf_list(config: BenchConfig, tests: list[tuple[Any, str]]) -> list[str]:
    """PDF names as the tests spell them: from --pdfs when given, else the tests' own."""
    if config.pdfs is None:
        return sorted({test.pdf for test, _ in tests})
    if not config.pdfs.is_dir():
        raise EvalInputError(f"--pdfs directory not found: {config.pdfs}")
    return sorted(path.relative_to(config.pdfs).as_posix() for path in config.pdfs.rglob("*.pdf"))


def score(config: BenchConfig, math_mode: MathMode) -> dict[str, Any]:
    outputs = PageOutputs(config.outputs)
    with math_rendering(math_mode):
        tests = load_tests(config.test_files)
        pdfs = pdf_list(config, tests)
        untested = sorted(set(pdfs) - {test.pdf for test, _ in tests})
        if config.baseline:
            tests = add_baseline_tests(tests, pdfs)
        results = [judge(test, file, outputs, math_mode) for test, file in tests]
    report = summarise(results, config)
    report.update(
        outputs=str(config.outputs),
        layout=outputs.layout,
        test_files=[str(path) for path in config.test_files],
        math_render=math_mode.as_json(),
        pdfs_without_tests=untested,
    )
    return report


def summarise(results: list[ScoredTest], config: BenchConfig) -> dict[str, Any]:
    _, bench_utils = import_bench()
    by_file: dict[str, list[ScoredTest]] = defaultdict(list)
    by_type: dict[str, list[ScoredTest]] = defaultdict(list)
    by_pdf: dict[str, list[ScoredTest]] = defaultdict(list)
    for result in results:
        by_file[result.file].append(result)
        by_type[result.test.type].append(result)
        by_pdf[result.test.pdf].append(result)

    # olmocr's overall is the mean of the files' pass shares; unscored tests are in no share, and
    # a file with no scored test (a math-only file without a renderer) has no share to average.
    scored_files = [scored for group in by_file.values() if (scored := _scored(group))]
    overall, ci = None, None
    if scored_files:
        overall = sum(map(_pass_share, scored_files)) / len(scored_files)
        ci = bootstrap_ci(bench_utils, [[float(r.passed) for r in group] for group in scored_files], config)
    missing = sorted({f"{r.test.pdf}#page={r.test.page}" for r in results if r.explanation == MISSING_PAGE})
    return {
        "benchmark": "olmocr-bench",
        "overall": {
            "score": overall,
            "ci95": ci,
            "bootstrap_samples": config.bootstrap_samples,
            "seed": config.seed,
            "excludes": exclusions(results),
        },
        "by_file": {name: _group_row(group, _pass_share) for name, group in sorted(by_file.items())},
        # benchmark.py's per-type figure: mean over tests of the share of repeats that passed.
        "by_type": {kind: _group_row(group, _repeat_share) for kind, group in sorted(by_type.items())},
        "by_pdf": {pdf: _group_row(group, _pass_share) for pdf, group in sorted(by_pdf.items())},
        "tests": [
            {
                "id": r.test.id,
                "pdf": r.test.pdf,
                "page": r.test.page,
                "type": r.test.type,
                "file": r.file,
                "score": r.score,
                "passed": r.passed,
                "explanation": r.explanation,
                "unscored": r.unscored,
            }
            for r in results
        ],
        "missing_pages": missing,
    }


def exclusions(results: list[ScoredTest]) -> dict[str, Any] | None:
    """What every score leaves out: the unscored tests per type and why; None when none is."""
    unscored = [r for r in results if not r.scored]
    if not unscored:
        return None
    return {
        "tests": len(unscored),
        "by_type": dict(sorted(Counter(r.test.type for r in unscored).items())),
        "reason": "; ".join(sorted({r.unscored for r in unscored})),
    }


def _group_row(group: list[ScoredTest], share: Callable[[list[ScoredTest]], float]) -> dict[str, Any]:
    """score/passed/total over the group's scored tests; unscored ones are counted apart."""
    scored = _scored(group)
    row: dict[str, Any] = {
        "score": share(scored) if scored else None,
        "passed": _passed(scored),
        "total": len(scored),
        "unscored": len(group) - len(scored),
    }
    if row["unscored"]:
        row["unscored_reason"] = "; ".join(sorted({r.unscored for r in group if not r.scored}))
    return row


def bootstrap_ci(bench_utils, groups: list[list[float]], config: BenchConfig) -> list[float]:
    """olmocr's per-file bootstrap (it draws from numpy's global generator, seeded here)."""
    import numpy as np

    np.random.seed(config.seed)
    flat = [value for group in groups for value in group]
    low, high = bench_utils.calculate_bootstrap_ci(
        flat, n_bootstrap=config.bootstrap_samples, ci_level=0.95, splits=[len(group) for group in groups]
    )
    return [float(low), float(high)]


def _scored(group: list[ScoredTest]) -> list[ScoredTest]:
    return [result for result in group if result.scored]


def _passed(scored: list[ScoredTest]) -> int:
    return sum(result.passed for result in scored)


def _pass_share(scored: list[ScoredTest]) -> float:
    return _passed(scored) / len(scored)


def _repeat_share(scored: list[ScoredTest]) -> float:
    return sum(result.score for result in scored) / len(scored)
