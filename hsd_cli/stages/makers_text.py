"""The makers' rules for a model's text that hsd's stages do not already apply: a recipe's
post-processing (recipes.postprocess) where it turns the model's answer into the page's text.
olmOCR's front matter and DeepSeek-OCR-2's grounding tags are read by the stages themselves, by
the family's dialect (stages.dialect, stages.grounding), so they are not applied twice."""

from __future__ import annotations

from dataclasses import replace

from hsd_cli.recipes.postprocess import POSTPROCESSORS
from hsd_cli.recipes.recipe import Recipe
from hsd_cli.records.page import Reading

# The post-processings that turn the answer into other text: Chandra's HTML into Markdown,
# HunyuanOCR's long repeated tails cut.
TEXT_RULES = frozenset({"chandra_html", "chandra1_html", "hunyuan_repeats"})


def makers_text(reading: Reading, recipe: Recipe) -> Reading:
    """The reading with the page's text as the recipe's makers keep it, and the model's own text
    kept beside it (`model_text`, in the page JSON) where the two differ."""
    if recipe.output.postprocess not in TEXT_RULES:
        return reading
    text = POSTPROCESSORS[recipe.output.postprocess](reading.text, 0).text or ""
    return reading if text == reading.text else replace(reading, text=text, model_text=reading.text)
