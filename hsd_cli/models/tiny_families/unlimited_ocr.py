"""The tiny recipe of Unlimited-OCR: the shared two-layer text model as a DeepSeek-V2-style one
(plain multi-head attention, a dense then a mixture-of-experts layer) with reference sliding-window
attention over 8 generated tokens, not 128 (so a test's few hundred tokens cross the window many
times), under a two-layer SAM encoder whose features feed a two-layer CLIP-style encoder.

Sizes keep the real ratios: a 64-pixel global view and 40-pixel tiles of 2-pixel patches (the real
1024 and 640 of 16-pixel patches), the SAM grid downsampled by 4 (8 x 8 queries a global view,
5 x 5 a tile, each row closed by a newline token)."""

from __future__ import annotations

from dataclasses import replace

from hsd_cli.models.tiny_families.deepseek_ocr2 import DEEPSEEK_OCR2_TOKENS, deepseek_text, sam_encoder
from hsd_cli.models.tiny_families.recipe import TinyRecipe

# DeepSeek's tokens, in a chat template of DeepSeek's form: the image token, then the prompt.
UNLIMITED_OCR_TOKENS = replace(
    DEEPSEEK_OCR2_TOKENS,
    chat_template=(
        "<｜begin▁of▁sentence｜>{% for message in messages %}{% if message['role'] == 'user' %}<|User|>: "
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n\n"
        "{% else %}<|Assistant|>: {{ message['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|Assistant|>: {% endif %}"
    ),
)

WINDOW = 8
_PATCH = 2
_TILE = 40
_GLOBAL = 64


def _unlimited_ocr(tokenizer, tokens, text, common):
    from transformers import UnlimitedOcrConfig

    settings = deepseek_text(tokenizer, text, model_type="unlimited_ocr_text", sliding_window=WINDOW)
    settings.pop("layer_types", None)  # every layer reference sliding-window attention, as the real model's
    sam = sam_encoder(_GLOBAL, _PATCH)
    # The SAM features are the encoder's patch embeddings: its width is SAM's last channels.
    encoder = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=2)
    return UnlimitedOcrConfig(
        text_config=settings, vision_config=dict(sam_config=sam, encoder_config=encoder),
        image_token_id=common["image_token_id"], tie_word_embeddings=False,
    )


def _unlimited_ocr_processor(tokenizer, config):
    from transformers import UnlimitedOcrProcessor

    from hsd_cli.decoding.hf_target.families.unlimited_ocr import pil_image_processor

    image_processor = pil_image_processor(size={"height": _GLOBAL, "width": _GLOBAL}, tile_size=_TILE, max_patches=4)
    return UnlimitedOcrProcessor(
        image_processor, tokenizer, chat_template=tokenizer.chat_template, patch_size=_PATCH, downsample_ratio=4
    )


RECIPES = {"unlimited_ocr": TinyRecipe(_unlimited_ocr, _unlimited_ocr_processor, UNLIMITED_OCR_TOKENS)}
