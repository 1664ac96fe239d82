from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsd_cli.cli import app
from tests import fixtures


@pytest.fixture(scope="session", autouse=True)
def isolated_user_config(tmp_path_factory):
    """A developer's own ~/.config/hsd (config.toml, model settings) must not change what the tests
    see; session-scoped, so the session fixtures' conversions are isolated too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config-home")))
        yield


@pytest.fixture(scope="session")
def docs_dir(tmp_path_factory) -> Path:
    """A born-digital PDF and its degraded scan, made once per session."""
    root = tmp_path_factory.mktemp("docs")
    fixtures.born_digital_pdf(root / "report.pdf")
    fixtures.scanned_pdf(root / "report.pdf", root / "scan.pdf")
    return root


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2.5-VL, built once per session (seeded: the same weights every time)."""
    # Imported here: it imports torch, which only the tests that use the model should pay for.
    from hsd_cli.models.tiny_families import build_tiny_random

    return build_tiny_random("qwen2_5_vl", tmp_path_factory.mktemp("tiny_qwen2_5_vl"))


def run_hsd(*args: str):
    """Run the CLI in-process; stdout and stderr stay separate as in a shell."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="session")
def converted(docs_dir, tmp_path_factory) -> dict:
    """One default (auto) conversion of the fixtures, shared by the read-only tests."""
    out = tmp_path_factory.mktemp("out")
    result = run_hsd("convert", docs_dir, "-o", out, "--json", "--page-markers")
    assert result.exit_code == 0, result.output
    return {"out": out, "summary": json.loads(result.stdout)}
