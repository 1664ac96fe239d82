"""Tiny recipes of MiniCPM-OCR and MiniCPM-V 4.6 / 4.7: a vision tower of two 32-wide layers (the
window merger after the first) over Qwen3.5's tiny hybrid text model (mrope.py's). Crops are
small enough that the tests' 80x100 pictures are sliced into a grid after the thumbnail, so the
slice markers, the image ids and 4.7's canvas positions are all decoded."""

from __future__ import annotations

from dataclasses import replace

from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.models.tiny_families.mrope import hybrid_text, hybrid_weights
from hsd_cli.models.tiny_families.recipe import TinyRecipe
from hsd_cli.models.tiny_tokens import QWEN_TOKENS

# MiniCPM's markers around a picture, its slices and its id, by the names its processor reads
# them from the tokenizer; the chat template writes the bare image token, which the processor
# replaces by the id, the thumbnail's and the slices' placeholders.
MINICPM_TOKENS = replace(
    QWEN_TOKENS,
    vision_start="<image>",
    vision_end="</image>",
    chat_template=QWEN_TOKENS.chat_template.replace("<|vision_start|><|image_pad|><|vision_end|>", "<|image_pad|>"),
    named=(
        ("slice_start_token", "<slice>"), ("slice_end_token", "</slice>"),
        ("image_id_start_token", "<image_id>"), ("image_id_end_token", "</image_id>"),
    ),
)

# (vision patch, the image processor's crop resolution): 4 image tokens a crop in both modes.
_PATCH_AND_CROP = {"4x": (14, 56), "16x": (7, 56)}


def _config(config_name: str, downsample_mode: str, canvas_markers: bool = False):
    def config(tokenizer, tokens, text, common):
        import transformers

        ids = tokenizer.convert_tokens_to_ids
        patch, _ = _PATCH_AND_CROP[downsample_mode]
        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=patch, image_size=4 * patch,
        )
        markers = dict(
            image_start_id=ids(tokens.vision_start), image_end_id=ids(tokens.vision_end), slice_start_id=ids("<slice>"),
            slice_end_id=ids("</slice>"), newline_id=ids("Ċ"),  # "\n" in the byte-level vocabulary
        ) if canvas_markers else {}
        return getattr(transformers, config_name)(
            text_config=dict(hybrid_text(text), model_type="qwen3_5_text"), vision_config=vision, insert_layer_id=0,
            image_token_id=ids(tokens.image), video_token_id=ids(tokens.video), downsample_mode=downsample_mode,
            tie_word_embeddings=False, **markers,
        )

    return config


def _processor(family: str, downsample_mode: str):
    def processor(tokenizer, config):
        patch, crop = _PATCH_AND_CROP[downsample_mode]
        return adapter_for(family).new_processor(tokenizer, patch_size=patch, scale_resolution=crop, downsample_mode=downsample_mode)

    return processor


def _one_d_weights(model) -> None:
    """Qwen3.5's tiny weights (mrope.py), full attention's output x2 more. With 1-D positions a
    picture's crops make prompts of 50 tokens and more, over which attention spreads: at Qwen3.5's
    x2, rows decoded one position off (test_bf16_batches' control) first left plain decoding by
    only 0 to 3 bf16 units, which the bf16 checks cannot tell from rounding."""
    hybrid_weights(model)
    for module in model.modules():
        if type(module).__name__.endswith("Attention") and hasattr(module, "o_proj"):
            module.o_proj.weight.mul_(2.0)


RECIPES = {
    "minicpm_ocr": TinyRecipe(_config("MiniCPMOcrConfig", "4x"), _processor("minicpm_ocr", "4x"), MINICPM_TOKENS, _one_d_weights),
    "minicpmv4_6": TinyRecipe(_config("MiniCPMV4_6Config", "16x"), _processor("minicpmv4_6", "16x"), MINICPM_TOKENS, _one_d_weights),
    "minicpmv4_7": TinyRecipe(
        _config("MiniCPMV4_7Config", "16x", canvas_markers=True), _processor("minicpmv4_7", "16x"), MINICPM_TOKENS, hybrid_weights
    ),
}
