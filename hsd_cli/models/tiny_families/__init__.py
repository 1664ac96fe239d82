"""Tiny random models of every supported family, built from each family's real config with its
shapes shrunk: the models of the exactness tests and `hsd bench decode --tiny-random`. A family's
recipe (`TinyRecipe`) lives in the module of its kind (a module per family where it needs more);
`TINY_FAMILIES` lists them in the order the tests take them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from hsd_cli.models.tiny import build_tiny_tokenizer, text_settings, vision_token_settings
from hsd_cli.models.tiny_families import deepseek_ocr2, granite4_vision, kosmos2_5, minicpm, mrope, one_d, unlimited_ocr
from hsd_cli.models.tiny_families.recipe import TinyRecipe

RECIPES: dict[str, TinyRecipe] = {
    **mrope.RECIPES, **one_d.RECIPES, **kosmos2_5.RECIPES, **deepseek_ocr2.RECIPES, **granite4_vision.RECIPES, **minicpm.RECIPES,
    **unlimited_ocr.RECIPES,
}
TINY_FAMILIES = tuple(RECIPES)


def tiny_config(tokenizer, recipe: TinyRecipe):
    # head_dim 16 -> 8 rotary frequencies split over the (temporal, height, width) axes.
    text = text_settings(
        tokenizer, recipe.tokens, width=64, layers=2, heads=4, kv_heads=2, ffn=128, max_positions=4096, mrope_section=[2, 3, 3]
    )
    # Larger init than the real 0.02 so a random model's greedy text depends on its context
    # instead of falling into a short loop at once.
    text["initializer_range"] = 0.3
    common = dict(vision_token_settings(tokenizer, recipe.tokens), tie_word_embeddings=False)
    return recipe.config(tokenizer, recipe.tokens, text, common)


def build_tiny_random(family: str, out_dir: str | Path, seed: int = 0, layers: Sequence[str] | None = None) -> Path:
    """Build a tiny random model + processor of `family`, save both to `out_dir`, return it.
    `layers`: the decoder's layer kinds (a real model's `layer_types`) instead of the recipe's,
    at the recipe's tiny widths (profiles/issue.py measures what a real depth costs to issue).

    The rows of the LM head for special tokens are zeroed so greedy decoding never ends on
    its own: logits of random rows are spread around 0, so a zero logit is never the argmax.
    (Where the embeddings are tied, as in LightOnOCR, those tokens' input embeddings are zero.)
    """
    from transformers import AutoModelForImageTextToText

    if family not in RECIPES:
        raise ValueError(f"no tiny recipe for {family!r}; known: {', '.join(TINY_FAMILIES)}")
    recipe = RECIPES[family]
    out_dir = Path(out_dir)
    tokenizer = build_tiny_tokenizer(recipe.tokens)
    config = tiny_config(tokenizer, recipe)
    if layers is not None:
        config.text_config.num_hidden_layers, config.text_config.layer_types = len(layers), list(layers)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for token in recipe.tokens.all:
            model.get_output_embeddings().weight[tokenizer.convert_tokens_to_ids(token)].zero_()
        if recipe.weights is not None:
            recipe.weights(model)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.save_pretrained(out_dir)
    recipe.processor(tokenizer, config).save_pretrained(out_dir)
    return out_dir
