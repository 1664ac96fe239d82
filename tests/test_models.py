"""`hsd models`: families with settings, where the settings and the models are found."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import asdict
from pathlib import Path

import pytest

import hsd_cli
import hsd_cli.configs
from hsd_cli.decoding.hf_target.families import ADAPTERS
from hsd_cli.models.family_settings import all_settings, settings_for
from hsd_cli.models.tiny_families import TINY_FAMILIES
from hsd_cli.settings_files import SettingsFileError
from tests.conftest import run_hsd

CHECKOUT = Path(__file__).resolve().parents[1]
# The settings files a contributor edits; the installed package must ship every one of them.
CHECKOUT_FAMILIES = sorted(path.stem for path in (CHECKOUT / "configs" / "models").glob("*.toml"))


@pytest.fixture(autouse=True)
def user_config_home(tmp_path, monkeypatch) -> Path:
    """An empty user config home, so a developer's own ~/.config/hsd/models cannot change results."""
    home = tmp_path / "config-home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def write_settings(directory: Path, name: str, values: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    # JSON strings, integers and string lists are also valid TOML values.
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items()), encoding="utf-8")
    return path


def hsd_models_json(env: dict[str, str]) -> dict:
    """`hsd models --json` through the installed `hsd` command, as a user runs it."""
    hsd = shutil.which("hsd", path=str(Path(sys.executable).parent))
    assert hsd, "the hsd command is installed next to this Python"
    proc = subprocess.run([hsd, "models", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_family_file_loads_and_unknown_families_get_the_default():
    families = {s.family for s in all_settings()}
    assert {"default", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"} <= families
    assert settings_for("no_such_family").family == "default"
    assert "LateX" in settings_for("qwen2_5_vl").page_prompt  # olmOCR's own prompt, typo included


def test_models_reports_what_the_hf_cache_holds(tmp_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2-VL-2B-Instruct" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen2_vl"}')
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    proc = subprocess.run(
        [sys.executable, "-m", "hsd_cli.cli", "models", "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    found = {m["id"]: m["path"] for f in listing["families"] for m in f["models"]}
    assert found["Qwen/Qwen2-VL-2B-Instruct"] == str(snapshot)
    assert found["Qwen/Qwen3-VL-8B-Instruct"] is None
    assert listing["looked_in"]["hf_home"] == str(tmp_path)


def test_hsd_models_lists_every_family_from_the_installed_package(user_config_home):
    listing = hsd_models_json({**os.environ, "XDG_CONFIG_HOME": str(user_config_home)})
    assert [f["family"] for f in listing["families"]] == CHECKOUT_FAMILIES
    # The wheel's hsd_cli/configs/models, or the checkout's configs/models in an editable install.
    packaged_dir = Path(hsd_cli.configs.__file__).resolve().parent / "models"
    for family in listing["families"]:
        assert family["settings_from"] == "packaged"
        assert Path(family["settings"]).resolve() == packaged_dir / f"{family['family']}.toml"
    assert [s.family for s in all_settings()] == CHECKOUT_FAMILIES


def readme_served_table() -> dict[str, dict[str, str]]:
    """README's table of the families hsd serves ("With a VLM"), each row's cells by column name,
    keyed by the family's model_type."""
    readme = (CHECKOUT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### With a VLM", 1)[1].split("\n### ", 1)[0]
    tables = []
    for block in re.findall(r"(?:^\|.*\|\n)+", section, flags=re.MULTILINE):
        header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in block.splitlines()]
        tables.append({row[0].strip("`"): dict(zip(header, row)) for row in rows})
    return next(t for t in tables if all("model ids" in row for row in t.values()))


def test_the_readme_table_lists_every_family_hsd_serves():
    """Every family with a settings file and its known ids, as the code has them; `default` holds
    the settings of a family without a file of its own, not a family."""
    served = readme_served_table()
    settings = {s.family: s for s in all_settings() if s.family != "default"}
    assert set(served) == set(settings) == set(ADAPTERS)
    for family, row in served.items():
        assert set(re.findall(r"`([^`]+)`", row["model ids"])) == set(settings[family].known_ids), family
        if "tiny random" in row["tested here"]:
            assert family in TINY_FAMILIES


def test_user_settings_replace_a_family_whole_and_add_new_ones(user_config_home):
    models_dir = user_config_home / "hsd" / "models"
    replaced = {**asdict(settings_for("qwen2_vl")), "page_prompt": "my prompt", "known_ids": ["me/my-qwen2"]}
    write_settings(models_dir, "qwen2_vl", replaced)
    write_settings(models_dir, "my_vl", {**asdict(settings_for("default")), "family": "my_vl", "known_ids": []})

    assert settings_for("qwen2_vl").page_prompt == "my prompt"
    assert settings_for("my_vl").family == "my_vl"
    assert settings_for("qwen3_vl").page_prompt != "my prompt"
    result = run_hsd("models", "--json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    origins = {f["family"]: (f["settings_from"], f["settings"]) for f in listing["families"]}
    assert set(origins) == {*CHECKOUT_FAMILIES, "my_vl"}
    assert origins["qwen2_vl"] == ("user", str(models_dir / "qwen2_vl.toml"))
    assert origins["my_vl"] == ("user", str(models_dir / "my_vl.toml"))
    assert origins["qwen3_vl"][0] == "packaged"
    assert listing["looked_in"]["user_settings"] == str(models_dir)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"page_promt": "typo"}, "unknown key(s) page_promt"),
        ({"max_new_tokens": "many"}, "max_new_tokens must be a TOML int"),
        ({"draft_match": "words"}, "draft_match must be one of chars, tokens"),
        ({"table_format": "latex"}, "table_format must be one of either, html, pipe"),
        ({"line_breaks": "wrapped"}, "line_breaks must be one of joined, kept"),
        ({"family": "qwen3_vl"}, "family must be 'qwen2_vl'"),
    ],
)
def test_a_broken_user_settings_file_is_a_one_line_usage_error(user_config_home, values, complaint):
    path = write_settings(user_config_home / "hsd" / "models", "qwen2_vl", {**asdict(settings_for("qwen2_vl")), **values})
    with pytest.raises(SettingsFileError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
        settings_for("qwen2_vl")
    result = run_hsd("models")
    assert result.exit_code == 2
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("error: model settings ") and str(path) in first_line and complaint in first_line
    assert "Traceback" not in result.stderr


def test_a_user_settings_file_missing_keys_names_them(user_config_home):
    write_settings(user_config_home / "hsd" / "models", "my_vl", {"family": "my_vl", "description": "mine"})
    with pytest.raises(SettingsFileError, match="missing key.s. page_prompt, region_prompt, draft_match"):
        settings_for("my_vl")


@pytest.mark.skipif(os.environ.get("HSD_EXPECT_INSTALLED") != "1", reason=".ci/run sets it: it tests a wheel install")
def test_the_suite_runs_against_the_installed_wheel_not_the_checkout(user_config_home):
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    package_dir = Path(hsd_cli.__file__).resolve().parent
    assert package_dir == site_packages / "hsd_cli", f"hsd_cli imported from {package_dir}"
    assert not package_dir.is_relative_to(CHECKOUT)
    shipped = sorted(path.stem for path in (package_dir / "configs" / "models").glob("*.toml"))
    assert shipped == CHECKOUT_FAMILIES
    for family in CHECKOUT_FAMILIES:
        assert settings_for(family).family == family
    # Subprocesses the tests start (`python -m hsd_cli.cli`) must import it from there too.
    proc = subprocess.run(
        [sys.executable, "-c", "import hsd_cli; print(hsd_cli.__file__)"], capture_output=True, text=True, check=True
    )
    assert Path(proc.stdout.strip()).resolve().parent == package_dir
