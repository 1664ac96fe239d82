"""The tiny recipe of DeepSeek-OCR-2: the shared two-layer text model as a DeepSeek-V2-style one
(plain multi-head attention, the first layer dense and the second a mixture of experts, as the
real model's layers are), under a two-layer SAM encoder and a two-layer query encoder.

The query encoder's banks are fixed in the model (144 queries for a tile, 256 for the global view
of a larger picture): every view is that many image tokens whatever the encoder's size, so an
image here is 145 image tokens or more, not 4 to 16. Sizes keep the real ratios: 96-pixel tiles
and a 128-pixel global view of 2-pixel patches (the real 768 and 1024 of 16-pixel patches), and
the SAM grid downsampled by 4 to the query grid (12 x 12 and 16 x 16)."""

from __future__ import annotations

from hsd_cli.models.tiny_families.recipe import TinyRecipe
from hsd_cli.models.tiny_tokens import TinyTokens

# DeepSeek's sentence tokens and its image token; it has no video or image-delimiter tokens, so
# those slots name the image token again. The grounding tags and the table cells are special
# tokens of its vocabulary too. No chat template: the model is prompted in its plain format.
DEEPSEEK_OCR2_TOKENS = TinyTokens(
    pad="<｜▁pad▁｜>",
    eos="<｜end▁of▁sentence｜>",
    image="<image>",
    video="<image>",
    vision_start="<image>",
    vision_end="<image>",
    others=("<｜begin▁of▁sentence｜>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>", "<td>", "</td>"),
)

_PATCH = 2
_TILE = 96
_GLOBAL = 128


def deepseek_text(tokenizer, text: dict, **overrides) -> dict:
    """The shared text model as DeepSeek-V2's (DeepSeek-OCR-2's and Unlimited-OCR's)."""
    settings = dict(text, max_position_embeddings=8192, **overrides)
    settings["num_key_value_heads"] = settings["num_attention_heads"]  # multi-head attention, as the real model
    settings["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    settings["bos_token_id"] = tokenizer.convert_tokens_to_ids("<｜begin▁of▁sentence｜>")
    # The real model's router (softmax, greedy top-k, 2 shared experts) over 4 experts, not 64.
    settings.update(
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=32, topk_method="greedy",
        n_group=1, topk_group=1, routed_scaling_factor=1.0, mlp_layer_types=["dense", "sparse"],
    )
    return settings


def sam_encoder(global_side: int, patch: int) -> dict:
    """A two-layer SAM encoder over a `global_side`-pixel view of `patch`-pixel patches."""
    return dict(
        hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2, mlp_dim=64,
        image_size=global_side, patch_size=patch, window_size=4, global_attn_indexes=[1], downsample_channels=[32, 64],
        # SAM's default init (1e-10) leaves a random encoder at zero: every picture the same features.
        initializer_range=0.02,
    )


def _deepseek_ocr2(tokenizer, tokens, text, common):
    from transformers import DeepseekOcr2Config

    settings = deepseek_text(tokenizer, text, model_type="deepseek_ocr2_text")
    sam = sam_encoder(_GLOBAL, _PATCH)
    encoder = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, vocab_size=1,
    )
    return DeepseekOcr2Config(
        text_config=settings, vision_config=dict(sam_config=sam, encoder_config=encoder),
        image_token_id=common["image_token_id"], tie_word_embeddings=False,
    )


def _deepseek_ocr2_processor(tokenizer, config):
    from transformers import DeepseekOcr2Processor
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil

    image_processor = DeepseekOcr2ImageProcessorPil(size={"height": _GLOBAL, "width": _GLOBAL}, tile_size=_TILE)
    return DeepseekOcr2Processor(image_processor, tokenizer, patch_size=_PATCH, downsample_ratio=4)


RECIPES = {"deepseek_ocr2": TinyRecipe(_deepseek_ocr2, _deepseek_ocr2_processor, DEEPSEEK_OCR2_TOKENS)}
