"""Where option values come from: TOML config files < HSD_* environment < command-line flags.

Flags and environment variables are click's own precedence; config files become click's
`default_map`, which sits just below them. Files, later wins: the user's config
(`$XDG_CONFIG_HOME/hsd/config.toml`), the project's (`./hsd.toml`), then `--config FILE`.
Keys are the long option names (`dpi`, `max-pixels` or `max_pixels`) under a `[convert]` table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from hsd_cli.settings_files import (
    SettingsFileError,
    read_toml,
    unknown_keys,
    user_config_dir,
)

SECTION = "convert"


def default_config_files() -> list[Path]:
    return [user_config_dir() / "config.toml", Path("hsd.toml")]


def read_config_file(path: Path, known: set[str]) -> dict[str, Any]:
    table = read_toml(path, "config").get(SECTION, {})
    if not isinstance(table, dict):
        raise SettingsFileError(f"[{SECTION}] in {path} must be a table")
    values = {key.replace("-", "_"): value for key, value in table.items()}
    if unknown := unknown_keys(values, known):
        raise SettingsFileError(f"unknown key(s) in {path} [{SECTION}]: {unknown}")
    return values


def load_config_callback(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """Eager --config callback: merge config files into the command's default_map before other options."""
    if ctx.resilient_parsing:
        return value
    known = {p.name for p in ctx.command.params if p.name} - {"config"}
    files = [p for p in default_config_files() if p.is_file()]
    if value:
        files.append(Path(value))
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    try:
        for path in files:
            for key, setting in read_config_file(path, known).items():
                merged[key] = setting
                origins[key] = str(path)
    except SettingsFileError as exc:
        raise typer.BadParameter(str(exc), ctx=ctx, param=param) from None
    ctx.default_map = {**(ctx.default_map or {}), **merged}
    ctx.meta["hsd_config_origins"] = origins
    return value


def describe_sources(ctx: typer.Context) -> list[tuple[str, Any, str]]:
    """(option, effective value, where it came from) for every option of a parsed context."""
    origins = ctx.meta.get("hsd_config_origins", {})
    rows = []
    for param in ctx.command.params:
        if not param.name or param.name == "config" or param.param_type_name != "option":
            continue
        source = ctx.get_parameter_source(param.name)
        where = {
            "DEFAULT_MAP": f"config {origins.get(param.name, '?')}",
            "ENVIRONMENT": f"env {param.envvar}",
            "COMMANDLINE": "command line",
        }.get(source.name if source else "", "default")
        value = ctx.params.get(param.name)
        rows.append((param.name, "***" if param.name == "password" and value else value, where))
    return rows
