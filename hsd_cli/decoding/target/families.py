"""What differs between model families: processors, chat prompts, positions (1-D or M-RoPE with
its rope deltas), image inputs, vision and stop tokens. One small `FamilyAdapter` per family;
`adapter_for(model_type)` picks it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image


QWEN_VISION_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
# Glm46VProcessor's names: it finds videos between <|begin_of_video|> and <|end_of_video|>.
GLM_VISION_TOKENS = {
    "image_token": "<|image|>",
    "video_token": "<|video|>",
    "video_start": "<|begin_of_video|>",
    "video_end": "<|end_of_video|>",
}


def _image_only_processor_class(base: type, tokens: dict[str, str] = QWEN_VISION_TOKENS) -> type:
    """A subclass of a Qwen-VL-style processor without the video processor (which needs
    torchvision). `tokens`: the attributes the base sets, with their default tokens; each also
    gets its id as `<name>_id`."""

    class ImageOnlyProcessor(base):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            for name, default in tokens.items():
                setattr(self, name, getattr(tokenizer, name, None) or default)
                setattr(self, f"{name}_id", tokenizer.convert_tokens_to_ids(getattr(self, name)))
            # Skip the base __init__ (it wants a video processor) and go to ProcessorMixin's.
            super(base, self).__init__(image_processor, tokenizer, chat_template=chat_template)

    # Saved processor configs then name the official class, as in a real model directory.
    ImageOnlyProcessor.__name__ = base.__name__
    ImageOnlyProcessor.__qualname__ = f"{base.__name__}ImageOnly"
    return ImageOnlyProcessor


class FamilyAdapter:
    """What differs per model family. Subclasses are small; see `QwenVLAdapter`."""

    model_types: tuple[str, ...] = ()

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's `position_ids` and, per row, the rope delta: the offset added to
        (real tokens so far + depth) to get a new token's position. Left padding is skipped."""
        attention = inputs["attention_mask"].long()
        text_positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return self.position_ids(model, text_positions), torch.zeros(attention.shape[0], dtype=torch.long)

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, K) absolute text positions -> what the model's `position_ids` expects."""
        return positions

    def processor_images(self, images: Sequence[Image.Image | None]):
        """The images of a batch (None = a text-only row) as the processor takes them."""
        return [im for im in images if im is not None] or None

    def chat_text(self, processor, prompt: str, with_image: bool) -> str:
        # An empty prompt sends the image alone (as LightOnOCR is prompted).
        content = ([{"type": "image"}] if with_image else []) + ([{"type": "text", "text": prompt}] if prompt else [])
        messages = [{"role": "user", "content": content}]
        return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def vision_token_ids(self, config) -> list[int]:
        """Placeholder and delimiter tokens of images and videos (never real output)."""
        names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        return [getattr(config, n) for n in names if getattr(config, n, None) is not None]

    def stop_token_ids(self, model, tokenizer) -> list[int]:
        ids = model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)
        return ids


class QwenVLAdapter(FamilyAdapter):
    """Qwen2-VL and Qwen2.5-VL: MRoPE with 3 position rows and a per-sequence rope delta."""

    model_types = ("qwen2_vl", "qwen2_5_vl")

    def load_processor(self, path: str, trust_remote_code: bool):
        # Built from parts: AutoProcessor would also build the video processor, which needs
        # torchvision, and the default image processor backend needs it too.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        image_processor = self._image_processor_class().from_pretrained(path)
        template = _processor_chat_template(path) or tokenizer.chat_template
        return self._processor_class()(image_processor, tokenizer, chat_template=template)

    def new_processor(self, tokenizer, **image_settings):
        """A processor for a model built here (tiny random or replay): the family's processor
        classes around `tokenizer`, the image processor made with `image_settings`."""
        image_processor = self._image_processor_class()(**image_settings)
        return self._processor_class()(image_processor, tokenizer, chat_template=tokenizer.chat_template)

    def _processor_base(self) -> type:
        from transformers import Qwen2_5_VLProcessor

        return Qwen2_5_VLProcessor

    def _processor_class(self) -> type:
        return _image_only_processor_class(self._processor_base())

    def _image_processor_class(self) -> type:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs.get("image_grid_thw") is None:
            return super().prefill_positions(model, inputs)
        # Computed here, never read from model.model.rope_deltas: that attribute goes stale.
        positions, deltas = model.model.get_rope_index(
            inputs["input_ids"],
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs["image_grid_thw"],
            attention_mask=inputs["attention_mask"],
        )
        return positions, deltas.view(-1).cpu()

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        # Text tokens after the image use the same position on every MRoPE axis.
        return positions.unsqueeze(0).expand(self.rope_axes(model), -1, -1)

    def rope_axes(self, model) -> int:
        return 3


class Qwen2VLAdapter(QwenVLAdapter):
    model_types = ("qwen2_vl",)

    def _processor_base(self) -> type:
        from transformers import Qwen2VLProcessor

        return Qwen2VLProcessor


class Qwen25VLAdapter(QwenVLAdapter):
    model_types = ("qwen2_5_vl",)


class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL: interleaved MRoPE and deepstack vision features; the same position rule."""

    model_types = ("qwen3_vl",)

    def _processor_base(self) -> type:
        from transformers import Qwen3VLProcessor

        return Qwen3VLProcessor


class PaddleOCRVLAdapter(QwenVLAdapter):
    """PaddleOCR-VL: Qwen-style 3-axis MRoPE over an ERNIE text model; no video processor."""

    model_types = ("paddleocr_vl",)

    def _processor_class(self) -> type:
        from transformers import PaddleOCRVLProcessor

        return PaddleOCRVLProcessor

    def _image_processor_class(self) -> type:
        from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

        return PaddleOCRVLImageProcessorPil


class HunYuanVLAdapter(QwenVLAdapter):
    """HunYuanVL (HunyuanOCR): XD-RoPE with as many axes as `mrope_section` has entries (4 in
    HunyuanOCR); text tokens carry their sequence position on every axis."""

    model_types = ("hunyuan_vl",)

    def rope_axes(self, model) -> int:
        return len(model.config.text_config.rope_parameters["mrope_section"])

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers numbers images across the whole batch on the image-index axis: a row's
        # image would get its batch position as index, and other logits than decoded alone.
        if inputs.get("image_grid_thw") is None or inputs["input_ids"].shape[0] == 1:
            return super().prefill_positions(model, inputs)
        images_per_row = (inputs["input_ids"] == model.config.im_start_id).sum(-1).tolist()
        grids = inputs["image_grid_thw"].split(images_per_row)
        rows = [
            super(HunYuanVLAdapter, self).prefill_positions(model, {
                "input_ids": inputs["input_ids"][b : b + 1],
                "mm_token_type_ids": inputs["mm_token_type_ids"][b : b + 1],
                "attention_mask": inputs["attention_mask"][b : b + 1],
                "image_grid_thw": grid if len(grid) else None,
            })
            for b, grid in enumerate(grids)
        ]
        return torch.cat([positions for positions, _ in rows], dim=1), torch.cat([deltas for _, deltas in rows])

    def vision_token_ids(self, config) -> list[int]:
        return [config.image_token_id, config.im_start_id, config.im_end_id, config.im_newline_id]

    def _processor_class(self) -> type:
        from transformers import HunYuanVLProcessor

        return HunYuanVLProcessor

    def _image_processor_class(self) -> type:
        from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil

        return HunYuanVLImageProcessorPil


class GlmOcrAdapter(QwenVLAdapter):
    """GLM-OCR: GLM-4V-style 3-axis M-RoPE with Qwen's position rule (text tokens carry their
    position on every axis, shifted after the image by the row's rope delta); GLM-4.6V's processor
    without its video processor."""

    model_types = ("glm_ocr",)

    def _processor_class(self) -> type:
        from transformers import Glm46VProcessor

        return _image_only_processor_class(Glm46VProcessor, GLM_VISION_TOKENS)

    def _image_processor_class(self) -> type:
        from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil

        return Glm46VImageProcessorPil

    def vision_token_ids(self, config) -> list[int]:
        names = ("image", "video", "image_start", "image_end", "video_start", "video_end")
        return [getattr(config, f"{name}_token_id") for name in names]

    def stop_token_ids(self, model, tokenizer) -> list[int]:
        # GLM chats have no end-of-turn token: a reply ends where the next turn's role token
        # would start, so those end it even if the generation config does not name them.
        ids = super().stop_token_ids(model, tokenizer)
        vocabulary = tokenizer.get_vocab()
        return ids + [vocabulary[t] for t in ("<|user|>", "<|observation|>") if t in vocabulary and vocabulary[t] not in ids]


class Idefics3Adapter(FamilyAdapter):
    """Idefics3 (SmolVLM, SmolDocling, granite-docling): plain 1-D positions over a Llama-style
    text model; images are given per prompt."""

    model_types = ("idefics3",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer, Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config_file = _model_file(path, "processor_config.json")
        settings = json.loads(config_file.read_text()) if config_file is not None else {}
        template = _processor_chat_template(path) or tokenizer.chat_template
        return Idefics3Processor(
            Idefics3ImageProcessorPil.from_pretrained(path),
            tokenizer,
            image_seq_len=settings.get("image_seq_len", 169),
            chat_template=template,
        )

    def processor_images(self, images: Sequence[Image.Image | None]):
        return [[im] if im is not None else [] for im in images] if any(im is not None for im in images) else None


class LightOnOcrAdapter(FamilyAdapter):
    """LightOnOCR: a Pixtral vision encoder over a Qwen3 text model with plain 1-D positions;
    AutoProcessor's processor (its image processor falls back to PIL without torchvision)."""

    model_types = ("lighton_ocr",)


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
        config_file = _model_file(path, "config.json")
        vision = json.loads(config_file.read_text()).get("vision_config", {}) if config_file is not None else {}
        return self.new_processor(
            tokenizer, GotOcr2ImageProcessorPil.from_pretrained(path),
            image_tokens=got_ocr2_image_tokens(vision.get("image_size", 1024), vision.get("patch_size", 16)),
        )

    def new_processor(self, tokenizer, image_processor, image_tokens: int):
        return _got_ocr2_processor_class()(image_processor, tokenizer, num_image_tokens=image_tokens)

    def chat_text(self, processor, prompt: str, with_image: bool) -> str:
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


ADAPTERS: dict[str, FamilyAdapter] = {
    t: a
    for a in (
        Qwen2VLAdapter(), Qwen25VLAdapter(), Qwen3VLAdapter(), PaddleOCRVLAdapter(), HunYuanVLAdapter(), GlmOcrAdapter(),
        Idefics3Adapter(), LightOnOcrAdapter(), QianfanOcrAdapter(), GotOcr2Adapter(),
    )
    for t in a.model_types
}


def adapter_for(model_type: str) -> FamilyAdapter:
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise ValueError(f"model family {model_type!r} is not supported; supported: {sorted(ADAPTERS)}") from None


def _model_file(path: str, name: str) -> Path | None:
    """A file of a local model directory or hub repository (downloaded), or None if absent."""
    from transformers.utils import cached_file

    found = cached_file(path, name, _raise_exceptions_for_missing_entries=False)
    return Path(found) if found else None


def _processor_chat_template(path: str) -> str | None:
    """The processor-level chat template (Qwen-VL repositories keep it outside the tokenizer)."""
    for name in ("chat_template.jinja", "chat_template.json"):
        file = _model_file(path, name)
        if file is not None:
            text = file.read_text()
            return json.loads(text)["chat_template"] if name.endswith(".json") else text
    return None
