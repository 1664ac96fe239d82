"""Tiny recipe of Granite 4 Vision (`granite4_vision`): LLaVA-NeXT's tiled images (a base view,
the best-fitting grid of tiles, a newline embedding a row) through windowed Q-Former downsamplers,
over a Granite text model with plain 1-D positions; DeepStack and spatial features of several
vision layers are added at the image tokens of chosen text layers during the prefill."""

from __future__ import annotations

from hsd_cli.models.tiny_families.recipe import TinyRecipe
from hsd_cli.models.tiny_tokens import IDEFICS3_TOKENS

def _granite4_vision(tokenizer, tokens, text, common):
    from transformers import Granite4VisionConfig

    # Granite's multipliers, with logits unscaled: at the other families' scale, so that the
    # logits-rule tests' bigram bonus and penalties reorder tokens as they do there.
    granite = dict(text, model_type="granite4_vision_text", embedding_multiplier=2.0, logits_scaling=1.0, residual_multiplier=0.5)
    del granite["rope_parameters"], granite["head_dim"]
    # 32-pixel tiles of 8-pixel patches: a 4 x 4 grid, 2 x 2 after the "1/2" downsampler. The
    # Q-Former's heads are the vision width / 64, so the vision width is 64.
    vision = dict(
        model_type="clip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, patch_size=8,
    )
    return Granite4VisionConfig(
        text_config=granite, vision_config=vision, qformer_config=dict(intermediate_size=128),
        image_token_index=common["image_token_id"], image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]],
        # The shared two text layers: vision layer 1's DeepStack features feed layer 0, the spatial
        # groups layer 1 (the model keeps one feature set a text layer, the last group's). Six layers
        # with a layer each drifted beyond the bf16 tests' near-tie bounds, calibrated on two.
        downsample_rate="1/2", deepstack_layer_map=[[1, 0]], spatial_target_layers=[1, 1, 1, 1],
        vision_feature_layer=-1, projector_dropout=0.0, tie_word_embeddings=False,
    )


def _granite4_vision_processor(tokenizer, config):
    from transformers import Granite4VisionProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    side = config.vision_config.image_size
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": side}, crop_size={"height": side, "width": side}, image_grid_pinpoints=config.image_grid_pinpoints,
    )
    return Granite4VisionProcessor(
        image_processor, tokenizer, patch_size=config.vision_config.patch_size, vision_feature_select_strategy="default",
        chat_template=tokenizer.chat_template, image_token=IDEFICS3_TOKENS.image, num_additional_image_tokens=1,
        downsample_rate=config.downsample_rate,
    )


RECIPES = {"granite4_vision": TinyRecipe(_granite4_vision, _granite4_vision_processor, IDEFICS3_TOKENS)}
