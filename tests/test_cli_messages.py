"""What hsd says to people: every help text as written, one clear line for a bad --model, error
messages that point at things that exist and keep their [brackets]."""

import re
import sys
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hsd_cli.cli import app
from tests.conftest import run_hsd

REPO = Path(__file__).resolve().parent.parent


def _commands(command, path=()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _flat(text: str) -> str:
    return re.sub(r"[\s│]+", " ", text)


def test_every_help_text_is_shown_as_written():
    """Rich reads `[word]` as markup and drops it; every command's and option's help must survive."""
    lost = []
    for path, command in _commands(typer.main.get_command(app)):
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"})
        assert result.exit_code == 0, (path, result.output)
        shown = _flat(result.output)
        texts = [("help", command.help.strip().split("\n\n")[0])] if command.help else []
        texts += [(param.name, param.help) for param in command.params if getattr(param, "help", None)]
        for name, text in texts:
            if _flat(text.replace("\\[", "[")) not in shown:
                lost.append((" ".join(path), name, text))
    assert not lost
    config_help = CliRunner().invoke(app, ["convert", "--help"], env={"COLUMNS": "1000"}).output
    assert "TOML config file ([convert] table; below env and flags)" in _flat(config_help)


def test_config_show_help_describes_config_show():
    result = CliRunner().invoke(app, ["config", "show", "--help"], env={"COLUMNS": "1000"})
    assert result.exit_code == 0
    assert "hsd config show" in result.output and "effective value" in result.output
    assert "Convert documents to Markdown" not in result.output


def test_errors_keep_their_brackets(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("convert = 1\n")
    result = run_hsd("config", "show", "--config", bad)
    assert result.exit_code == 2 and "[convert] in" in result.stderr


@pytest.mark.parametrize(
    ("content", "error"), [(b"[convert\n", "bad TOML in config"), (b"[convert]\ndpi = 100 # \xe9t\xe9\n", "not UTF-8")]
)
def test_a_config_file_that_cannot_be_read_is_one_line_and_a_usage_error(content, error, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(content)
    result = run_hsd("config", "show", "--config", bad)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("error:") == 1, result.stderr
    said = " ".join(result.stderr.split())  # wrapped at 80 columns
    assert error in said and str(bad) in "".join(result.stderr.split()), result.stderr


def test_a_failed_document_named_with_brackets_is_reported_by_its_name(tmp_path):
    (tmp_path / "notes [draft].pdf").write_text("not a pdf")
    result = run_hsd("convert", tmp_path / "notes [draft].pdf", "-o", tmp_path / "out")
    assert result.exit_code == 1
    assert "notes [draft].pdf: not a PDF or image" in result.stderr


@pytest.mark.parametrize("model", ["/no/such/dir", "./no-such-dir", "~/no-such-hsd-model", "a/b/c"])
def test_a_model_path_that_does_not_exist_is_an_environment_error(model, docs_dir, tmp_path):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", model)
    assert result.exit_code == 4
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no such directory" in errors[0], result.stderr
    assert "Repo id" not in result.stderr
    assert not (tmp_path / "report.md").exists()


def test_a_directory_without_config_json_is_no_model(docs_dir, tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", empty)
    assert result.exit_code == 4 and "has no config.json" in result.stderr


@pytest.mark.parametrize(("model_type", "said"), [("llava", "model family 'llava' is not supported; supported: ")])
def test_a_model_of_a_family_hsd_lacks_is_one_usage_error_before_any_work(model_type, said, docs_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(f'{{"model_type": "{model_type}"}}')
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {said}"), result.stderr
    assert "hsd models" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "report.md").exists()


def test_a_missing_eval_package_names_an_install_that_exists(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "olmocr.bench.tests", None)  # import now fails as if not installed
    (tmp_path / "tests.jsonl").write_text("")
    result = run_hsd("eval", "olmocr-bench", tmp_path, "--tests", tmp_path / "tests.jsonl")
    assert result.exit_code == 2
    message = _flat(result.stderr)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "eval" in project["optional-dependencies"]
    assert f"pip install '{project['name']}[eval]'" in message
    assert "olmocr==0.4.27" in (REPO / "README.md").read_text() and "olmocr==0.4.27" in message
    for named in re.findall(r"[\w./-]+\.md\b", message):
        assert (REPO / named).exists(), f"the message points to {named}, which does not exist"
