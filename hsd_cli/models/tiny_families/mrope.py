"""Tiny recipes of the M-RoPE families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (and MoE), PaddleOCR-VL,
HunyuanOCR, GLM-OCR): a vision tower of two 32-wide layers over the shared two-layer text model
(Qwen3.5's and Qwen3.5-MoE's hybrid text model: four layers, linear and full attention in turn)."""

from __future__ import annotations

import torch

from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.models.tiny import qwen25_vl_config
from hsd_cli.models.tiny_families.recipe import TinyRecipe
from hsd_cli.models.tiny_tokens import GLM_OCR_TOKENS, HUNYUAN_TOKENS, PADDLE_TOKENS


def _processor(family: str):
    """The family's processor, its image processor bounded to 4 to 16 merged image tokens."""

    def processor(tokenizer, config):
        patch = config.vision_config.patch_size
        merged = patch * config.vision_config.spatial_merge_size
        least, most = (2 * merged) ** 2, (4 * merged) ** 2
        if family == "glm_ocr":
            # GLM's image processor takes its pixel bounds as size edges, counting both frames of a
            # temporal patch (x2).
            pixels = dict(size={"shortest_edge": 2 * least, "longest_edge": 2 * most})
        else:
            pixels = dict(min_pixels=least, max_pixels=most)
        return adapter_for(family).new_processor(tokenizer, patch_size=patch, **pixels)

    return processor


def _qwen2_5_vl(tokenizer, tokens, text, common):
    return qwen25_vl_config(
        tokenizer, text, depth=2, width=32, heads=2, ffn=64, patch_size=14, merge_size=2, window_size=56, full_attention_blocks=[1]
    )


def _qwen2_vl(tokenizer, tokens, text, common):
    from transformers import Qwen2VLConfig

    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    return Qwen2VLConfig(text_config=text, vision_config=vision, **common)


def _qwen3_vl(tokenizer, tokens, text, common):
    from transformers import Qwen3VLConfig

    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, spatial_merge_size=2, out_hidden_size=64,
        patch_size=16, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[1],
    )
    return Qwen3VLConfig(text_config=text, vision_config=vision, **common)


def hybrid_text(text: dict) -> dict:
    """Qwen3.5's hybrid text settings around the shared tiny ones: linear and full attention in
    turn (the real models: three linear layers to one full), with grouped value heads as the real
    models have (Qwen3.5: 16 key heads, 32 value heads)."""
    return dict(
        text, num_hidden_layers=4, layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, rope_parameters=dict(text["rope_parameters"], partial_rotary_factor=1.0, mrope_section=[2, 3, 3]),
    )


QWEN3_5_VISION = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, spatial_merge_size=2, out_hidden_size=64,
    patch_size=16, temporal_patch_size=2, num_position_embeddings=64,
)


def _qwen3_5(tokenizer, tokens, text, common):
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=hybrid_text(text), vision_config=QWEN3_5_VISION, **common)


def _qwen3_5_moe(tokenizer, tokens, text, common):
    from transformers import Qwen3_5MoeConfig

    # Four experts, two per token, and the shared expert, each as narrow as a tiny MLP half.
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    return Qwen3_5MoeConfig(text_config=dict(hybrid_text(text), **moe), vision_config=QWEN3_5_VISION, **common)


def hybrid_weights(model) -> None:
    """Weights under which the tests can see what goes wrong in a hybrid model.

    Slow decays in every Gated DeltaNet layer: transformers draws A in [0.01, 16], so with random
    inputs most heads forget a token within a step or two, and a recurrent state that kept a
    rejected node, or missed an accepted one, would hardly move the logits (trained models keep a
    long memory in many heads). And full attention's output x2: its gated output is small beside
    the random MLPs', so a token one position off moved the logits by 0.4 (7 in Qwen3-VL's tiny
    model), too little for the bf16 checks to tell a misplaced row from rounding."""
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            module.A_log.copy_(torch.linspace(0.01, 0.3, module.A_log.numel()).log())
            module.dt_bias.fill_(-2.0)
        elif type(module).__name__.endswith("Attention") and hasattr(module, "o_proj"):
            module.o_proj.weight.mul_(2.0)


def _paddleocr_vl(tokenizer, tokens, text, common):
    from transformers import PaddleOCRVLConfig

    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        patch_size=14, image_size=56, spatial_merge_size=2,
    )
    return PaddleOCRVLConfig(text_config=text, vision_config=vision, **common)


def _hunyuan_vl(tokenizer, tokens, text, common):
    from transformers import HunYuanVLConfig

    # Four XD-RoPE axes as in HunyuanOCR: (sequence, width, height, image index).
    text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=[2, 2, 2, 2])
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        out_hidden_size=64, text_hidden_size=64, patch_size=16, spatial_merge_size=2,
    )
    return HunYuanVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=common["image_token_id"],
        im_start_id=common["vision_start_token_id"],
        im_end_id=common["vision_end_token_id"],
        im_newline_id=tokenizer.convert_tokens_to_ids("<｜hy_newline｜>"),
        tie_word_embeddings=False,
    )


def _glm_ocr(tokenizer, tokens, text, common):
    from transformers import GlmOcrConfig

    ids = tokenizer.convert_tokens_to_ids
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
    )
    return GlmOcrConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids(tokens.image),
        video_token_id=ids(tokens.video),
        image_start_token_id=ids(tokens.vision_start),
        image_end_token_id=ids(tokens.vision_end),
        video_start_token_id=ids("<|begin_of_video|>"),
        video_end_token_id=ids("<|end_of_video|>"),
        tie_word_embeddings=False,
    )


RECIPES = {
    "qwen2_vl": TinyRecipe(_qwen2_vl, _processor("qwen2_vl")),
    "qwen2_5_vl": TinyRecipe(_qwen2_5_vl, _processor("qwen2_5_vl")),
    "qwen3_vl": TinyRecipe(_qwen3_vl, _processor("qwen3_vl")),
    "qwen3_5": TinyRecipe(_qwen3_5, _processor("qwen3_5"), weights=hybrid_weights),
    "qwen3_5_moe": TinyRecipe(_qwen3_5_moe, _processor("qwen3_5_moe"), weights=hybrid_weights),
    "paddleocr_vl": TinyRecipe(_paddleocr_vl, _processor("paddleocr_vl"), PADDLE_TOKENS),
    "hunyuan_vl": TinyRecipe(_hunyuan_vl, _processor("hunyuan_vl"), HUNYUAN_TOKENS),
    "glm_ocr": TinyRecipe(_glm_ocr, _processor("glm_ocr"), GLM_OCR_TOKENS),
}
