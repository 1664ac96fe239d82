"""Tiny recipe of Kosmos-2.5: its own text and vision models (sinusoidal positions, a perceiver
over patch features), shrunk to the shared tiny sizes."""

from __future__ import annotations

from dataclasses import dataclass

from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.models.tiny_families.recipe import TinyRecipe
from hsd_cli.models.tiny_tokens import TinyTokens


@dataclass(frozen=True)
class FairseqOrderTokens(TinyTokens):
    """Special tokens that open the vocabulary with `<s>`, `<pad>`, `</s>` (ids 0, 1, 2, a fairseq
    dictionary's order), as Kosmos-2.5's config names its bos, pad and eos ids."""

    bos: str = "<s>"

    @property
    def all(self) -> list[str]:
        return list(dict.fromkeys([self.bos, *super().all]))


# Kosmos-2.5's processor writes the bos token `<s>` first and as the image placeholder, and reads
# the image delimiters from the tokenizer as `boi_token` and `eoi_token`. It has no video token:
# the field repeats the image token, so the tokenizer gets none of its own. `<md>` and `<ocr>` are
# the task prompts. No chat template: the processor writes the prompt.
KOSMOS2_5_TOKENS = FairseqOrderTokens(
    pad="<pad>",
    eos="</s>",
    image="<s>",
    video="<s>",
    vision_start="<image>",
    vision_end="</image>",
    others=("<md>", "<ocr>"),
    named=(("bos_token", "<s>"), ("boi_token", "<image>"), ("eoi_token", "</image>")),
)

PATCH = 16  # pixels a side, as the real image processor's
MAX_PATCHES = 16  # patches an image is resized to fill at most (4096: Kosmos2_5Processor's default)
IMAGE_TOKENS = 16  # latent queries, one image token each (2048 in transformers' Kosmos-2.5 config)


def _kosmos2_5(tokenizer, tokens, text, common):
    from transformers import Kosmos2_5Config

    text_model = dict(
        vocab_size=text["vocab_size"], embed_dim=text["hidden_size"], layers=text["num_hidden_layers"],
        ffn_dim=text["intermediate_size"], attention_heads=text["num_attention_heads"],
        max_position_embeddings=text["max_position_embeddings"], init_std=text["initializer_range"],
        pad_token_id=text["pad_token_id"], eos_token_id=text["eos_token_id"],
        bos_token_id=tokenizer.convert_tokens_to_ids(tokens.bos), tie_word_embeddings=False,
    )
    # Row and column ids run from 1 to MAX_PATCHES, so their tables have one more entry.
    vision = dict(
        hidden_size=32, patch_embed_hidden_size=PATCH * PATCH * 3, intermediate_size=64, head_dim=16,
        num_hidden_layers=2, num_attention_heads=2, max_num_patches=MAX_PATCHES + 1,
    )
    # Untied output embeddings (Kosmos-2.5 ties them): tied, and the input scaled by sqrt(width), a
    # random model's greedy output repeats its last token. The perceiver between the towers is
    # initialised from the outer config (0.02 by default): at the text model's larger init its image
    # embeddings are of the text's scale, so that the image changes the output.
    return Kosmos2_5Config(
        text_config=text_model, vision_config=vision, latent_query_num=IMAGE_TOKENS, tie_word_embeddings=False,
        initializer_range=text["initializer_range"],
    )


def _kosmos2_5_processor(tokenizer, config):
    from transformers.models.kosmos2_5.image_processing_pil_kosmos2_5 import Kosmos2_5ImageProcessorPil

    image_processor = Kosmos2_5ImageProcessorPil(patch_size={"height": PATCH, "width": PATCH}, max_patches=MAX_PATCHES)
    return adapter_for("kosmos-2.5").new_processor(tokenizer, image_processor, config.latent_query_num)


RECIPES = {"kosmos-2.5": TinyRecipe(_kosmos2_5, _kosmos2_5_processor, KOSMOS2_5_TOKENS)}
