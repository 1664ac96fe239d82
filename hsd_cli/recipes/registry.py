"""Which recipe a model reads by: the makers' recipe of a known model id, a recipe named on the
command line, or the family default (hsd's own way, as configs/models/*.toml and the render
options have it today) for a local directory or a model no maker's recipe covers."""

from __future__ import annotations

from hsd_cli.config import ConvertConfig
from hsd_cli.models.family_settings import ModelSettings, all_settings, settings_for
from hsd_cli.recipes.known import KNOWN_RECIPES
from hsd_cli.recipes.recipe import NO_RETRY, Decoding, Output, Prompt, Recipe, Render

FAMILY_DEFAULT_PREFIX = "hsd-"


def family_default(settings: ModelSettings) -> Recipe:
    """hsd's way with a family today: PyMuPDF at --dpi capped at --max-pixels (their defaults),
    the image before the family's page prompt, no system turn, greedy to the family's budget, no
    retry (the repetition guard's draft stands in), the text as decoded (the front matter and
    grounding splits stay with the stages, by the family's settings), pages joined by a blank line."""
    return Recipe(
        name=FAMILY_DEFAULT_PREFIX + settings.family,
        model_ids=settings.known_ids,
        family=settings.family,
        render=Render(renderer="pymupdf", rule="dpi", dpi=ConvertConfig.dpi, max_pixels=ConvertConfig.max_pixels, encoding="pil"),
        processor=None,
        prompt=Prompt(text=settings.page_prompt, order=("image", "text")),
        decoding=Decoding(max_new_tokens=settings.max_new_tokens),
        retry=NO_RETRY,
        output=Output(postprocess="plain", fallback="draft", page_join="\n\n"),
        source=f"configs/models/{settings.family}.toml; hsd_cli/config.py (dpi, max_pixels); "
        "hsd_cli/decoding/hf_target/families/base.py (chat_text: image first)",
    )


def family_defaults() -> dict[str, Recipe]:
    """Each family's default recipe by its name (hsd-<family>)."""
    return {recipe.name: recipe for recipe in map(family_default, all_settings())}


def recipes() -> dict[str, Recipe]:
    """Every recipe by name: the makers' and the family defaults."""
    return {recipe.name: recipe for recipe in KNOWN_RECIPES} | family_defaults()


def recipe_for(model_id_or_name: str) -> Recipe | None:
    """The makers' recipe for a known hub id (case aside, as the hub treats ids), or the recipe of
    that name; None for anything else (a local directory, an unknown id): the caller takes the
    family default of the model's type then."""
    by_name = recipes()
    if model_id_or_name in by_name:
        return by_name[model_id_or_name]
    wanted = model_id_or_name.casefold()
    for recipe in KNOWN_RECIPES:
        if wanted in (model_id.casefold() for model_id in recipe.model_ids):
            return recipe
    return None


def recipe_to_read(model_id: str, settings: ModelSettings) -> Recipe:
    """The recipe a model of this family reads by unless one is named: its makers' for a known
    id, where hsd can read it (a prompt with the page's text layer, olmOCR-0225's anchor, cannot be
    yet), else the family's default."""
    found = recipe_for(model_id)
    if found is not None and found.family == settings.family and found.prompt.anchor is None:
        return found
    return family_default(settings)


def recipe_named(name: str, family: str) -> Recipe:
    """The recipe a resolved ModelConfig names ("": the family's default)."""
    return recipes()[name] if name else family_default(settings_for(family))


def is_family_default(recipe: Recipe) -> bool:
    """Whether the recipe is a family's default: hsd's own way, the draft's rendering included."""
    return recipe.name.startswith(FAMILY_DEFAULT_PREFIX)
