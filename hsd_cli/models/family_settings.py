"""Per-family VLM settings: one `<model_type>.toml` per family, `default.toml` for the rest.

The files are edited in the checkout's `configs/models/` and ship as the package
`hsd_cli.configs` (pyproject.toml maps the directory), read through importlib.resources so that
wheel and editable installs find them alike. A file in the user's directory
(`$XDG_CONFIG_HOME/hsd/models/`, default `~/.config/hsd/models/`) replaces the packaged file of
the same name whole, or adds a family.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, fields
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from hsd_cli.settings_files import (
    SettingsFileError,
    read_toml,
    unknown_keys,
    user_config_dir,
)

PACKAGED_DIR: Traversable = files("hsd_cli.configs") / "models"
DRAFT_MATCHES = ("chars", "tokens")
# Keys with a fixed set of values (the first is the default where the key may be left out).
CHOICES = {
    "draft_match": DRAFT_MATCHES,
    "table_format": ("either", "html", "pipe"),
    "table_layout": ("either", "compact", "indented"),
    "emphasis": ("keep", "strip"),
    "line_breaks": ("joined", "kept"),
    "math_delimiters": ("either", "paren", "dollar"),
    "headings": ("either", "markdown", "plain"),
    "front_matter": ("none", "olmocr"),
    "grounding": ("none", "deepseek"),
}
# TOML value types for the field annotations below (strings: annotations are postponed).
TOML_TYPES = {"str": str, "int": int, "tuple[str, ...]": list}


@dataclass(frozen=True)
class ModelSettings:
    family: str
    description: str
    page_prompt: str
    region_prompt: str
    draft_match: str  # one of DRAFT_MATCHES
    region_padding_px: int
    max_new_tokens: int
    known_ids: tuple[str, ...] = ()
    # The family's dialect, for drafts written the way its models write (stages/dialect.py):
    table_format: str = "either"  # html, pipe, or either (both forms drafted)
    # An HTML table on one line (compact), one tag per line indented as pretty-printers do
    # (indented: 0/2, 2/4 and 4/8 spaces before rows/cells, all drafted), or either (all drafted).
    table_layout: str = "either"
    emphasis: str = "keep"  # keep or strip the text layer's *italic* and **bold** marks
    line_breaks: str = "joined"  # joined: a paragraph on one line; kept: as the page wraps it
    math_delimiters: str = "either"  # inline math as \(x\) (paren), $x$ (dollar) or either (both drafted)
    headings: str = "either"  # headings as `## Title` (markdown), bare (plain) or either (both drafted)
    # olmocr: outputs open with olmOCR's YAML block (language, rotation, table, diagram); it is
    # drafted, and split off the page's Markdown into its JSON. none: no front matter.
    front_matter: str = "none"
    # deepseek: outputs tag each block with its kind and boxes (stages/grounding.py); the tags are
    # split off the page's Markdown into its JSON's `grounding`. none: no tags.
    grounding: str = "none"


@dataclass(frozen=True)
class SettingsFile:
    path: Traversable
    user: bool  # from the user's directory rather than the package


def user_dir() -> Path:
    """The user's settings directory, beside the user's config.toml."""
    return user_config_dir() / "models"


def settings_files() -> dict[str, SettingsFile]:
    """Each family's settings file by family name (the file name), sorted; user files win."""
    packaged = {
        entry.name.removesuffix(".toml"): SettingsFile(entry, user=False)
        for entry in PACKAGED_DIR.iterdir()
        if entry.name.endswith(".toml")
    }
    users = {path.stem: SettingsFile(path, user=True) for path in user_dir().glob("*.toml")}
    return dict(sorted((packaged | users).items()))


def problems_in(data: dict, family: str) -> list[str]:
    """What is wrong with one family's settings table, in words for the user."""
    known = {field.name: field for field in fields(ModelSettings)}
    problems = []
    if unknown := unknown_keys(data, known):
        problems.append(f"unknown key(s) {unknown}")
    if missing := [name for name, field in known.items() if name not in data and field.default is MISSING]:
        problems.append(f"missing key(s) {', '.join(missing)}")
    for name, value in data.items():
        if name in known and type(value) is not TOML_TYPES[known[name].type]:
            problems.append(f"{name} must be a TOML {TOML_TYPES[known[name].type].__name__}")
    for name, choices in CHOICES.items():
        if data.get(name, choices[0]) not in choices:
            problems.append(f"{name} must be one of {', '.join(choices)}")
    if data.get("family", family) != family:
        problems.append(f"family must be {family!r}, the file's name")
    return problems


def read_settings(source: SettingsFile) -> ModelSettings:
    path = source.path
    data = read_toml(path, "model settings")
    if problems := problems_in(data, path.name.removesuffix(".toml")):
        raise SettingsFileError(f"model settings {path}: {'; '.join(problems)}")
    return ModelSettings(**{**data, "known_ids": tuple(data.get("known_ids", ()))})


def all_settings() -> list[ModelSettings]:
    return [read_settings(source) for source in settings_files().values()]


def settings_for(model_type: str) -> ModelSettings:
    sources = settings_files()
    return read_settings(sources.get(model_type) or sources["default"])


def model_type_of(model: str) -> str:
    """The `model_type` of a local model directory or a cached hub id (no download)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model, local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1").model_type


def locate_model(model: str) -> str | None:
    """Where a model is on this machine: a local directory, or the HF cache ($HF_HOME honoured)."""
    path = Path(model)
    if path.is_dir():
        return str(path.resolve()) if (path / "config.json").is_file() else None
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(model, "config.json")
    return str(Path(hit).parent) if isinstance(hit, str) else None
