"""The family adapter's base: what every model family has by default, and helpers its
subclasses share (processor building, files of a model directory)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


def image_only_processor_class(base: type, tokens: dict[str, str] = QWEN_VISION_TOKENS) -> type:
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



@dataclass(frozen=True)
class ChatLayout:
    """How a chat template's turns are laid out for a model, as its makers send them: the image
    before or after the prompt's text in the user turn, and a system turn (None: none sent, the
    template's default applies; "" is an empty one). Families whose adapter writes its own
    conversation (GOT-OCR 2.0, Kosmos-2.5, DeepSeek-OCR-2) keep their makers' layout."""

    image_first: bool = True
    system: str | None = None


IMAGE_FIRST = ChatLayout()


def rope_index_positions(model, inputs: dict, grid_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt's M-RoPE positions and per-row rope deltas from the model's own `get_rope_index`,
    its images' sizes given under `grid_key`. Computed here, never read from
    model.model.rope_deltas: that attribute goes stale."""
    positions, deltas = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        attention_mask=inputs["attention_mask"],
        **{grid_key: inputs[grid_key]},
    )
    return positions, deltas.view(-1).cpu()

class FamilyAdapter:
    """What differs per model family. Subclasses are small; see `QwenVLAdapter`."""

    model_types: tuple[str, ...] = ()
    # Special tokens that are part of the model's text (markup it writes): kept where decoding
    # skips special tokens.
    text_special_tokens: tuple[str, ...] = ()

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

    def chat_text(self, processor, prompt: str, with_image: bool, layout: ChatLayout = IMAGE_FIRST) -> str:
        # An empty prompt sends the image alone (as LightOnOCR is prompted).
        image = [{"type": "image"}] if with_image else []
        text = [{"type": "text", "text": prompt}] if prompt else []
        system = [] if layout.system is None else [{"role": "system", "content": layout.system}]
        messages = system + [{"role": "user", "content": image + text if layout.image_first else text + image}]
        return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def processor_inputs(
        self, processor, images: Sequence[Image.Image | None], prompts: Sequence[str], layout: ChatLayout = IMAGE_FIRST,
    ):
        """The processor's batch for (image, prompt) rows, left-padded so that every row's next
        token is at the end."""
        texts = [self.chat_text(processor, p, im is not None, layout) for im, p in zip(images, prompts)]
        return processor(
            text=texts, images=self.processor_images(images), return_tensors="pt", padding=True, padding_side="left"
        )

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


class PartsProcessorAdapter(FamilyAdapter):
    """A family whose processor is built from parts: AutoProcessor would also build the video
    processor, which needs torchvision, and the default image processor backend needs it too.
    Subclasses name the (image-only) processor class, `_processor_class`, and the PIL image
    processor class, `_image_processor_class`."""

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        image_processor = self._image_processor_class().from_pretrained(path)
        template = processor_chat_template(path) or tokenizer.chat_template
        return self._processor_class()(image_processor, tokenizer, chat_template=template)

    def new_processor(self, tokenizer, **image_settings):
        """A processor for a model built here (tiny random or replay): the family's processor
        classes around `tokenizer`, the image processor made with `image_settings`."""
        image_processor = self._image_processor_class()(**image_settings)
        return self._processor_class()(image_processor, tokenizer, chat_template=tokenizer.chat_template)


def model_file(path: str, name: str) -> Path | None:
    """A file of a local model directory or hub repository (downloaded), or None if absent."""
    from transformers.utils import cached_file

    found = cached_file(path, name, _raise_exceptions_for_missing_entries=False)
    return Path(found) if found else None


def processor_chat_template(path: str) -> str | None:
    """The processor-level chat template (Qwen-VL repositories keep it outside the tokenizer)."""
    for name in ("chat_template.jinja", "chat_template.json"):
        file = model_file(path, name)
        if file is not None:
            text = file.read_text()
            return json.loads(text)["chat_template"] if name.endswith(".json") else text
    return None
