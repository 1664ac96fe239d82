"""Families with plain 1-D positions: Idefics3 (SmolDocling, granite-docling-258M),
Granite-Docling (granite-for-docling), LightOnOCR, Mistral3 (LightOnOCR-2), Qianfan-OCR, GOT-OCR 2.0."""

from __future__ import annotations

import json
from collections.abc import Sequence

from PIL import Image

from .base import IMAGE_FIRST, ChatLayout, FamilyAdapter, model_file, processor_chat_template


class Idefics3Adapter(FamilyAdapter):
    """Idefics3 (SmolVLM, SmolDocling, granite-docling): plain 1-D positions over a Llama-style
    text model; images are given per prompt."""

    model_types = ("idefics3",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer, Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config_file = model_file(path, "processor_config.json")
        settings = json.loads(config_file.read_text()) if config_file is not None else {}
        template = processor_chat_template(path) or tokenizer.chat_template
        return Idefics3Processor(
            Idefics3ImageProcessorPil.from_pretrained(path),
            tokenizer,
            image_seq_len=settings.get("image_seq_len", 169),
            chat_template=template,
        )

    def processor_images(self, images: Sequence[Image.Image | None]):
        return [[im] if im is not None else [] for im in images] if any(im is not None for im in images) else None


class GraniteDoclingAdapter(Idefics3Adapter):
    """Granite-Docling's model type of transformers 5.23 (granite-for-docling): Idefics3's layout
    (512-pixel tiles and a thumbnail, tagged by row and column) over a Granite text model with
    plain 1-D positions, with DeepStack vision features added at the image tokens during the
    prefill only. Pages take the processor's default (coarse) connector path, as `generate` does
    unless the caller routes them to the fine one. (granite-docling-258M is model type idefics3.)"""

    model_types = ("granite_docling",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer, GraniteDoclingProcessor
        from transformers.models.granite_docling.image_processing_pil_granite_docling import GraniteDoclingImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config_file = model_file(path, "processor_config.json")
        settings = json.loads(config_file.read_text()) if config_file is not None else {}
        return GraniteDoclingProcessor(
            GraniteDoclingImageProcessorPil.from_pretrained(path), tokenizer,
            image_seq_len=settings.get("image_seq_len", 64), chat_template=processor_chat_template(path) or tokenizer.chat_template,
        )


class LightOnOcrAdapter(FamilyAdapter):
    """LightOnOCR: a Pixtral vision encoder over a Qwen3 text model with plain 1-D positions;
    AutoProcessor's processor (its image processor falls back to PIL without torchvision)."""

    model_types = ("lighton_ocr",)


class Mistral3Adapter(FamilyAdapter):
    """Mistral3 (LightOnOCR-2, Mistral Small 3.x): a Pixtral vision encoder and patch merger over
    a text model with plain 1-D positions (Qwen3 in LightOnOCR-2); AutoProcessor's processor (the
    checkpoint's own, or PixtralProcessor; its image processor falls back to PIL without
    torchvision). Images add break and end tokens to the image tokens, as in LightOnOCR."""

    model_types = ("mistral3",)


class Granite4VisionAdapter(FamilyAdapter):
    """Granite 4 Vision: LLaVA-NeXT's tiled images through windowed Q-Former downsamplers over a
    Granite text model with plain 1-D positions; DeepStack and spatial vision features are added
    at the image tokens during the prefill only. AutoProcessor's processor (its LLaVA-NeXT image
    processor falls back to PIL without torchvision)."""

    model_types = ("granite4_vision",)


class QianfanOcrAdapter(FamilyAdapter):
    """Qianfan-OCR: an InternVL-style vision encoder (448-pixel tiles, pixel shuffle, an MLP
    projector) over a Qwen3 text model with plain 1-D positions; AutoProcessor's processor (its
    GOT-OCR2 image processor falls back to PIL without torchvision). The chat template's `<image>`
    becomes `<img>`, the image-context tokens and `</img>`; only the context token is in the
    config, so it is the one vision token named here."""

    model_types = ("qianfan_ocr",)


class GotOcr2Adapter(FamilyAdapter):
    """GOT-OCR 2.0: a SAM-style vision encoder over a Qwen2 text model with plain 1-D positions.
    Its processor has no chat template (the checkpoint has none): it builds its own ChatML
    conversation, which `chat_text` writes out the same way, and it wants an image on every call,
    so text-only prompts go to the tokenizer alone. Every image is one fixed-size tile
    (`crop_to_patches` off, as the processor defaults) of as many image tokens as the encoder's
    output grid has cells; that count is read from the model's config."""

    model_types = ("got_ocr2",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config_file = model_file(path, "config.json")
        vision = json.loads(config_file.read_text()).get("vision_config", {}) if config_file is not None else {}
        return self.new_processor(
            tokenizer, GotOcr2ImageProcessorPil.from_pretrained(path),
            image_tokens=got_ocr2_image_tokens(vision.get("image_size", 1024), vision.get("patch_size", 16)),
        )

    def new_processor(self, tokenizer, image_processor, image_tokens: int):
        return _got_ocr2_processor_class()(image_processor, tokenizer, num_image_tokens=image_tokens)

    def chat_text(self, processor, prompt: str, with_image: bool, layout: ChatLayout = IMAGE_FIRST) -> str:
        # GotOcr2Processor's own conversation (built when it is given no text), with `prompt` as the query.
        start, end = processor.message_start_token, processor.message_end_token
        image = f"{processor.img_start_token}{processor.image_token}{processor.img_end_token}\n" if with_image else ""
        return f"{start}{processor.system_query}{end}{start}user\n{image}{prompt}{end}{start}assistant\n"

    def stop_token_ids(self, model, tokenizer) -> list[int]:
        # GOT's examples stop generation on the end-of-turn token, which its generation config
        # does not name as an end token.
        ids = super().stop_token_ids(model, tokenizer)
        end = tokenizer.get_vocab().get("<|im_end|>")
        return ids + [end] if end is not None and end not in ids else ids


def got_ocr2_image_tokens(image_size: int, patch_size: int) -> int:
    """Image tokens per tile: the encoder's patch grid after the projector's two stride-2 convolutions."""
    side = image_size // patch_size
    for _ in range(2):
        side = (side + 1) // 2
    return side * side


def _got_ocr2_processor_class() -> type:
    from transformers import GotOcr2Processor

    class TextOrImageProcessor(GotOcr2Processor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, num_image_tokens=None, **kwargs):
            super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)
            if num_image_tokens is not None:
                self.num_image_tokens = num_image_tokens

        def __call__(self, images=None, text=None, **kwargs):
            if images is None:  # GotOcr2Processor refuses a call without images
                return self.tokenizer(text, **kwargs)
            return super().__call__(images=images, text=text, **kwargs)

    # Saved processor configs then name the official class, as in a real model directory.
    TextOrImageProcessor.__name__ = GotOcr2Processor.__name__
    TextOrImageProcessor.__qualname__ = f"{GotOcr2Processor.__name__}TextOrImage"
    return TextOrImageProcessor
