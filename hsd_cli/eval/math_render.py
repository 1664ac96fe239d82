"""How olmOCR-Bench math tests compare formulas: KaTeX in headless Chromium, or not at all.

olmocr's scorer (`olmocr.bench.katex.render`) renders every formula with KaTeX in a Playwright
browser and compares the rendered symbols and their layout. Playwright's own browser download
is not reachable here, so the browser is looked up (Playwright's, else a system Chromium such as
Debian's `chromium`) and olmocr is pointed at it. Without one, math tests are unscored: left out
of every score, with the reason in the report (see `olmocr_bench.unscored_reason`).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SYSTEM_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class MathRender(StrEnum):
    AUTO = "auto"  # KaTeX when a browser starts, else math tests unscored
    OFF = "off"  # no browser started: math tests unscored


@dataclass(frozen=True)
class MathMode:
    """What the math tests of a run used; reported in the JSON as `math_render`."""

    katex: bool
    browser: str | None
    reason: str

    def as_json(self) -> dict[str, object]:
        return {"mode": "katex" if self.katex else "unscored", "browser": self.browser, "reason": self.reason}


def find_browser() -> str | None:
    """Playwright's own Chromium if installed, else the first Chromium on PATH."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            bundled = playwright.chromium.executable_path
        if bundled and Path(bundled).is_file():
            return bundled
    except Exception:  # no playwright driver, or it cannot start: fall back to PATH
        pass
    for name in SYSTEM_BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _probe(browser: str) -> str | None:
    """None when `browser` starts under Playwright, else the reason it does not."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            playwright.chromium.launch(executable_path=browser).close()
    except Exception as exc:
        return f"{browser} did not start under Playwright: {str(exc).splitlines()[0]}"
    return None


def choose_math_mode(requested: MathRender) -> MathMode:
    if requested is MathRender.OFF:
        return MathMode(False, None, "math rendering turned off (--math-render off)")
    browser = find_browser()
    reason = "Chromium not found (install Debian's chromium, or run `playwright install chromium`)"
    if browser is not None:
        failure = _probe(browser)
        if failure is None:
            return MathMode(True, browser, "KaTeX rendered in headless Chromium")
        reason = failure
    return MathMode(False, None, f"no KaTeX renderer: {reason}")


class _NotRendered:
    """Stands in for a render result when there is no browser.

    olmocr's MathTest renders its reference formula when it is built and rejects a render that
    `is None`, so this non-None value lets the tests load; the scorer then leaves them unscored.
    It is falsy because `MathTest.run` skips hypotheses whose render is falsy: run anyway, a test
    keeps only its exact-match rule and never claims a rendered comparison it did not make.
    """

    def __bool__(self) -> bool:
        return False


def _no_render(equation: str, *args: object, **kwargs: object) -> _NotRendered:
    return _NotRendered()


def _close_quietly(playwright, browser) -> None:
    # olmocr's own cleanup prints to stdout, which must carry only the --json object.
    with contextlib.suppress(Exception):
        browser.close()
    with contextlib.suppress(Exception):
        playwright.stop()


@contextlib.contextmanager
def math_rendering(mode: MathMode) -> Iterator[None]:
    """Within this block olmocr's math tests render with `mode`; its prints go to stderr."""
    import olmocr.bench.katex.render as render
    import olmocr.bench.tests as bench_tests

    saved = (render._BrowserOwner, bench_tests.render_equation)
    if mode.katex:
        browser_path = mode.browser

        class BrowserOwner(render._BrowserOwner):
            def __init__(self) -> None:
                from playwright.sync_api import sync_playwright

                self.p = sync_playwright().start()
                self.browser = self.p.chromium.launch(executable_path=browser_path)
                self._closed = False
                self._finalizer = weakref.finalize(self, _close_quietly, self.p, self.browser)

        render._BrowserOwner = BrowserOwner
    else:
        bench_tests.render_equation = _no_render
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        render._BrowserOwner, bench_tests.render_equation = saved
