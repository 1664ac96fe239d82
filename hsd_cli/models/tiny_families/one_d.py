"""Tiny recipes of the families with 1-D positions (Idefics3, Granite-Docling, LightOnOCR, Mistral3, Qianfan-OCR,
GOT-OCR 2.0): the shared two-layer text model as the family's own text model type, without M-RoPE."""

from __future__ import annotations

from hsd_cli.decoding.hf_target.families import adapter_for, got_ocr2_image_tokens
from hsd_cli.models.tiny_families.recipe import TinyRecipe
from hsd_cli.models.tiny_tokens import GOT_OCR2_TOKENS, IDEFICS3_TOKENS, LIGHTON_OCR_TOKENS, QIANFAN_OCR_TOKENS


def _one_d(text: dict, model_type: str) -> dict:
    """The shared text settings as `model_type`'s, with plain 1-D RoPE."""
    settings = dict(text, model_type=model_type)
    del settings["rope_parameters"]
    return settings


def _idefics3(tokenizer, tokens, text, common):
    from transformers import Idefics3Config

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
    return Idefics3Config(
        text_config=_one_d(text, "llama"), vision_config=vision, image_token_id=common["image_token_id"], scale_factor=2,
        tie_word_embeddings=False,
    )


def _idefics3_processor(tokenizer, config):
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    # One 32-pixel image, no splitting: (32 / 8)^2 patches / scale_factor^2 = 4 image tokens.
    side = {"longest_edge": config.vision_config.image_size}
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size=side, max_image_size=side)
    return Idefics3Processor(image_processor, tokenizer, image_seq_len=4, chat_template=tokenizer.chat_template)


def _granite_docling(tokenizer, tokens, text, common):
    from transformers import GraniteDoclingConfig

    # 32-pixel tiles of 8-pixel patches: 16 patches, pixel-shuffled by 2 to 4 tokens a tile (the
    # fine path, by 1, to 16); DeepStack features from both vision layers into the first two text layers.
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
        scale_factor=2, out_hidden_size=text["hidden_size"], deepstack_visual_indexes=[0, 1],
    )
    # Granite's multipliers, with logits unscaled: at the other families' scale, so that the
    # logits-rule tests' bigram bonus and penalties reorder tokens as they do there.
    granite = dict(_one_d(text, "granite_docling_text"), embedding_multiplier=2.0, logits_scaling=1.0, residual_multiplier=0.5)
    del granite["head_dim"]
    return GraniteDoclingConfig(text_config=granite, vision_config=vision, image_token_id=common["image_token_id"], tie_word_embeddings=False)


def _granite_docling_processor(tokenizer, config):
    from transformers import GraniteDoclingProcessor
    from transformers.models.granite_docling.image_processing_pil_granite_docling import GraniteDoclingImageProcessorPil

    # Pages split into 2 or 3 tiles of the vision tower's size and a thumbnail: 12 or 16 image
    # tokens, tagged by row and column as the real processor tags them.
    side = config.vision_config.image_size
    image_processor = GraniteDoclingImageProcessorPil(size={"height": side, "width": side}, min_patches=2, max_patches=3)
    return GraniteDoclingProcessor(image_processor, tokenizer, image_seq_len=4, chat_template=tokenizer.chat_template)


def _lighton_ocr(tokenizer, tokens, text, common):
    from transformers import LightOnOcrConfig

    vision = dict(
        model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        head_dim=16, image_size=112, patch_size=14,
    )
    # Tied input and output embeddings, as in LightOnOCR's own config.
    return LightOnOcrConfig(
        text_config=_one_d(text, "qwen3"), vision_config=vision, image_token_id=common["image_token_id"], spatial_merge_size=2
    )


def _lighton_ocr_processor(tokenizer, config):
    from transformers import LightOnOcrProcessor
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    # Images resized in steps of merged patches, at most 112 pixels a side: at most 16 image tokens.
    merged = config.vision_config.patch_size * config.spatial_merge_size
    image_processor = PixtralImageProcessorPil(patch_size=merged, size={"longest_edge": config.vision_config.image_size})
    return LightOnOcrProcessor(
        image_processor, tokenizer, patch_size=config.vision_config.patch_size,
        spatial_merge_size=config.spatial_merge_size, chat_template=tokenizer.chat_template,
    )


def _mistral3(tokenizer, tokens, text, common):
    from transformers import Mistral3Config

    # LightOnOCR-2's layout: LightOnOCR's Pixtral tower and Qwen3 text model (tied embeddings) as a
    # Mistral3 model, whose patch merger and projector differ from LightOnOCR's.
    lighton = _lighton_ocr(tokenizer, tokens, text, common)
    return Mistral3Config(
        text_config=lighton.text_config.to_dict(), vision_config=lighton.vision_config.to_dict(),
        image_token_index=common["image_token_id"], spatial_merge_size=lighton.spatial_merge_size,
    )


def _qianfan_ocr(tokenizer, tokens, text, common):
    from transformers import QianfanOCRConfig

    # 56-pixel tiles of 14-pixel patches: 16 patches, pixel-shuffled (x0.5) to 4 tokens a tile.
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14)
    return QianfanOCRConfig(
        text_config=_one_d(text, "qwen3"), vision_config=vision, image_token_id=common["image_token_id"], image_seq_length=4,
        downsample_ratio=0.5, tie_word_embeddings=False,
    )


def _qianfan_ocr_processor(tokenizer, config):
    from transformers import QianfanOCRProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    # Tiles of the vision tower's size, at most 3 and a thumbnail: 4 to 16 image tokens.
    side = config.vision_config.image_size[0]
    image_processor = GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=True, max_patches=3)
    return QianfanOCRProcessor(image_processor, tokenizer, image_seq_length=config.image_seq_length, chat_template=tokenizer.chat_template)


def _got_ocr2(tokenizer, tokens, text, common):
    from transformers import GotOcr2Config

    # 128-pixel tiles of 8-pixel patches: a 16 x 16 grid, 4 x 4 after the projector = 16 image tokens.
    vision = dict(
        hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2, mlp_dim=64,
        image_size=128, patch_size=8, window_size=4, global_attn_indexes=[1],
    )
    # Tied input and output embeddings, as in GOT-OCR 2.0's own config.
    return GotOcr2Config(
        text_config=_one_d(text, "qwen2"), vision_config=vision, image_token_index=common["image_token_id"], image_seq_length=16
    )


def _got_ocr2_processor(tokenizer, config):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    side = config.vision_config.image_size
    image_processor = GotOcr2ImageProcessorPil(size={"height": side, "width": side})
    return adapter_for("got_ocr2").new_processor(tokenizer, image_processor, got_ocr2_image_tokens(side, config.vision_config.patch_size))


RECIPES = {
    "idefics3": TinyRecipe(_idefics3, _idefics3_processor, IDEFICS3_TOKENS),
    "granite_docling": TinyRecipe(_granite_docling, _granite_docling_processor, IDEFICS3_TOKENS),
    "lighton_ocr": TinyRecipe(_lighton_ocr, _lighton_ocr_processor, LIGHTON_OCR_TOKENS),
    # LightOnOCR-2's processor is LightOnOCR's: image tokens without row breaks.
    "mistral3": TinyRecipe(_mistral3, _lighton_ocr_processor, LIGHTON_OCR_TOKENS),
    "qianfan_ocr": TinyRecipe(_qianfan_ocr, _qianfan_ocr_processor, QIANFAN_OCR_TOKENS),
    "got_ocr2": TinyRecipe(_got_ocr2, _got_ocr2_processor, GOT_OCR2_TOKENS),
}
