"""`hsd models`: the model families hsd has settings for, their known models, whether each is
present, the recipe each reads by, and the families hsd refuses with the reason."""

from __future__ import annotations

import json as json_lib
import os
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

USAGE_EXIT = 2


def reads(recipe) -> str:
    """How a recipe reads a page: "one pass", or "two steps" (the layout, then each block) and who
    finds the layout."""
    if recipe.two_step is None:
        return "one pass"
    return f"two steps (layout by {recipe.two_step.layout.finder}, then blocks)"


def models(
    json: Annotated[bool, typer.Option("--json", help="Print the list as JSON on stdout.")] = False,
) -> None:
    """List the model families hsd has settings for, their known models and whether each is present."""
    from hsd_cli.models.family_settings import (
        PACKAGED_DIR,
        locate_model,
        read_settings,
        settings_files,
        user_dir,
    )
    from hsd_cli.recipes.registry import family_default, recipe_to_read
    from hsd_cli.settings_files import SettingsFileError

    families = []
    try:
        for source in settings_files().values():
            settings = read_settings(source)
            families.append({
                "family": settings.family,
                "description": settings.description,
                "settings": str(source.path),
                "settings_from": "user" if source.user else "packaged",
                "default_recipe": family_default(settings).name,
                "models": [
                    {"id": model_id, "path": locate_model(model_id), "recipe": recipe.name, "reads": reads(recipe)}
                    for model_id in settings.known_ids
                    for recipe in [recipe_to_read(model_id, settings)]
                ],
            })
    except SettingsFileError as exc:
        hint = f"fix or remove it; the packaged files in {PACKAGED_DIR} show every key"
        console = Console(stderr=True)
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        console.print(f"  hint: {escape(hint)}", highlight=False, soft_wrap=True)
        raise typer.Exit(USAGE_EXIT) from None
    where = {
        "packaged_settings": str(PACKAGED_DIR),
        "user_settings": str(user_dir()),
        "hf_home": os.environ.get("HF_HOME", "~/.cache/huggingface"),
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE", "0"),
    }
    if json:
        sys.stdout.write(json_lib.dumps({"families": families, "looked_in": where}) + "\n")
        return
    table = Table(title="VLM families (local directories work for any of them: --model DIR)", title_justify="left")
    for column in ("family", "settings", "model", "recipe", "present"):
        table.add_column(column)
    for family in families:
        rows = family["models"] or [{"id": "(any local directory)", "path": None, "recipe": family["default_recipe"]}]
        for row in rows:
            table.add_row(family["family"], family["settings_from"], row["id"], row["recipe"], row["path"] or "no")
    console = Console()
    console.print(table)
    console.print(
        f"settings packaged in {where['packaged_settings']}; user settings in {where['user_settings']}"
        f" (a file there replaces the packaged one of the same name). HF cache under {where['hf_home']}",
        highlight=False,
    )



