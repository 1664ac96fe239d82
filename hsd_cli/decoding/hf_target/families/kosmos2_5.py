"""Kosmos-2.5: a Pix2Struct-style vision encoder whose features a perceiver turns into a fixed
number of latent queries, over a text model with fairseq-style sinusoidal positions."""

from __future__ import annotations

import torch

from .base import IMAGE_FIRST, ChatLayout, FamilyAdapter


class Kosmos25Adapter(FamilyAdapter):
    """Kosmos-2.5. Its text model looks positions up in a sinusoidal table whose first
    `pad_token_id + 1` rows stand for padding: the token at text position p (0 for the first) gets
    row `p + pad_token_id + 1`, as `generate` computes it from the token ids. (`generate` would give
    a `<pad>` token fed back the padding row: the two differ only after the model emits its own
    padding token.) A segment embedding marks the image span in the prompt; the prefill passes it,
    later steps add the text segment's, as `generate` does.

    Its processor writes the prompt itself: the bos token, `<image>`, one placeholder (`<s>`) per
    latent query, `</image>`, then our text (`<md>` asks for Markdown, `<ocr>` for text lines with
    boxes). It puts an image in every row, so text-only prompts go to the tokenizer alone; its
    image-span mask assumes rows that start at column 0, so it is shifted for left padding."""

    model_types = ("kosmos-2.5",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoConfig, AutoTokenizer
        from transformers.models.kosmos2_5.image_processing_pil_kosmos2_5 import Kosmos2_5ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        return self.new_processor(tokenizer, Kosmos2_5ImageProcessorPil.from_pretrained(path), config.latent_query_num)

    def new_processor(self, tokenizer, image_processor, image_tokens: int):
        # As many placeholders as the model has latent queries: the model puts one in each.
        return _kosmos2_5_processor_class()(image_processor, tokenizer, num_image_tokens=image_tokens)

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        return positions + model.config.text_config.pad_token_id + 1

    def chat_text(self, processor, prompt: str, with_image: bool, layout: ChatLayout = IMAGE_FIRST) -> str:
        # The processor opens image rows with the bos token itself; a text-only row opens with it here.
        return prompt if with_image else f"{processor.tokenizer.bos_token}{prompt}"

    def vision_token_ids(self, config) -> list[int]:
        # The image placeholder is the text model's bos token `<s>`; the config does not name the
        # ids of `<image>` and `</image>` (only the tokenizer has them).
        return [config.text_config.bos_token_id]


def _kosmos2_5_processor_class() -> type:
    from transformers import Kosmos2_5Processor

    class LeftPaddedProcessor(Kosmos2_5Processor):
        # Kosmos2_5Processor's own default (4096 patches) would override the image processor's
        # `max_patches`; without it, the image processor's configured value applies.
        images_kwargs = {}

        def __call__(self, images=None, text=None, **kwargs):
            if images is None:  # Kosmos2_5Processor refuses a call without images
                return self.tokenizer(text, **kwargs)
            if len(images) != len(text):
                raise ValueError("Kosmos-2.5 takes a batch of rows that all have an image, or none that has one")
            encoding = super().__call__(images=images, text=text, **kwargs)
            # Each row's image span, moved right by the padding in front of the row.
            starts = encoding["attention_mask"].argmax(-1).tolist()
            spans = encoding["image_embeds_position_mask"]
            encoding["image_embeds_position_mask"] = torch.stack([row.roll(start) for row, start in zip(spans, starts)])
            return encoding

    # Saved processor configs then name the official class, as in a real model directory.
    LeftPaddedProcessor.__name__ = Kosmos2_5Processor.__name__
    LeftPaddedProcessor.__qualname__ = f"{Kosmos2_5Processor.__name__}LeftPadded"
    return LeftPaddedProcessor
