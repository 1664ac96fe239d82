"""A scaled-down Qwen2.5-VL with its own tokenizer and the family's real processor.

Same architecture, processor classes, chat template and special tokens as the real family, so
`load_target` and `hsd convert --model` treat a replay model like any Qwen2.5-VL directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from hsd_cli.decoding.hf_target.families import ChatLayout, adapter_for
from hsd_cli.models.tiny import QWEN_TOKENS, build_tiny_tokenizer, offline_text, qwen25_vl_config, text_settings
from hsd_cli.recipes.messages import image_first
from hsd_cli.recipes.recipe import Recipe
from hsd_cli.recipes.registry import recipe_named
from hsd_cli.replay.fingerprint import replay_recipe

FAMILY = "qwen2_5_vl"
PATCH = 14
MERGE = 2
TOKEN_PIXELS = (PATCH * MERGE) ** 2  # pixels per merged image token


@dataclass(frozen=True)
class ReplayShape:
    """Model and tokenizer sizes. The default is the 6.7 M-parameter shape that memorised pages
    here (engineering notes); `TINY_SHAPE` is for tests."""

    vocab_size: int = 4096
    text_layers: int = 4
    text_width: int = 256
    text_heads: int = 4
    text_kv_heads: int = 2
    text_ffn: int = 768
    vision_depth: int = 4
    vision_width: int = 192
    vision_heads: int = 3
    vision_ffn: int = 384
    # The processor downscales pages (and large crops) to at most this many merged image tokens:
    # enough to tell pages apart, cheap enough to train on this CPU.
    max_image_tokens: int = 200
    min_image_tokens: int = 4


TINY_SHAPE = ReplayShape(
    vocab_size=600, text_layers=1, text_width=64, text_heads=2, text_kv_heads=1, text_ffn=128,
    vision_depth=1, vision_width=32, vision_heads=2, vision_ffn=64, max_image_tokens=16,
)


def _general_text() -> list[str]:
    """Offline general text so drafts that differ from the targets still tokenize sensibly."""
    import argparse
    import collections
    import difflib
    import string
    import textwrap

    return offline_text(argparse, collections, difflib, string, textwrap, json)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on `texts` plus general text, with Qwen's chat and vision tokens."""
    # min_frequency 2: no merges for one-off strings, which keeps the tokenizer general.
    return build_tiny_tokenizer(QWEN_TOKENS, vocab_size, corpus=[*texts, *_general_text()], min_frequency=2)


def model_config(shape: ReplayShape, tokenizer):
    head_dim = shape.text_width // shape.text_heads
    rotary = head_dim // 2  # frequencies, split over the (temporal, height, width) MRoPE axes
    section = [rotary - 2 * (3 * rotary // 8), 3 * rotary // 8, 3 * rotary // 8]
    text = text_settings(
        tokenizer,
        QWEN_TOKENS,
        width=shape.text_width,
        layers=shape.text_layers,
        heads=shape.text_heads,
        kv_heads=shape.text_kv_heads,
        ffn=shape.text_ffn,
        max_positions=8192,
        mrope_section=section,
    )
    return qwen25_vl_config(
        tokenizer,
        text,
        depth=shape.vision_depth,
        width=shape.vision_width,
        heads=shape.vision_heads,
        ffn=shape.vision_ffn,
        patch_size=PATCH,
        merge_size=MERGE,
        window_size=112,
        # Every block attends over the whole image: pages differ anywhere, not within windows.
        full_attention_blocks=range(shape.vision_depth),
    )


def build_processor(shape: ReplayShape, tokenizer):
    """The family's image-only processor (PIL backend) with the replay model's pixel limits."""
    return adapter_for(FAMILY).new_processor(
        tokenizer,
        patch_size=PATCH,
        merge_size=MERGE,
        min_pixels=shape.min_image_tokens * TOKEN_PIXELS,
        max_pixels=shape.max_image_tokens * TOKEN_PIXELS,
    )


def load_tokenizer(source: str):
    """A real Qwen2-family tokenizer (a directory or a hub id) for a replay model, with the chat
    template of the family's image prompts (a Qwen3 tokenizer's own template has no images)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {source}: {str(exc).strip().splitlines()[0]}") from None
    missing = [token for token in QWEN_TOKENS.all if tokenizer.convert_tokens_to_ids(token) in (None, tokenizer.unk_token_id)]
    if missing:
        raise ValueError(f"--tokenizer {source}: not a Qwen2-family tokenizer (no {', '.join(missing)})")
    tokenizer.chat_template = QWEN_TOKENS.chat_template
    return tokenizer


@dataclass(frozen=True)
class TrainedVocabulary:
    """The token ids a replay model is trained on: those its examples and the family's special
    tokens use, renumbered densely from 1, with 0 standing for every other id.

    A real tokenizer has ~150k ids of which a corpus uses a few thousand: logits over those few
    thousand cost what a build's own 4096-token vocabulary costs. The saved model gives each used
    id its trained rows and every other id row 0's, which training keeps below every answer token
    (row 0 is a class no answer has), so greedy decoding with the whole vocabulary picks what the
    trained model picks."""

    ids: tuple[int, ...]  # tokenizer ids; dense id = position + 1

    @classmethod
    def of(cls, tokenizer, token_lists) -> TrainedVocabulary:
        used = set(tokenizer.convert_tokens_to_ids(QWEN_TOKENS.all))
        for tokens in token_lists:
            used.update(int(token) for token in tokens)
        return cls(tuple(sorted(used)))

    @property
    def size(self) -> int:
        return len(self.ids) + 1

    def rows(self, tokenizer_size: int) -> torch.Tensor:
        """Dense id of every tokenizer id (0 where unused)."""
        table = torch.zeros(tokenizer_size, dtype=torch.long)
        table[torch.tensor(self.ids, dtype=torch.long)] = torch.arange(1, self.size)
        return table


_VISION_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
_TEXT_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
_VOCAB_WEIGHTS = ("model.language_model.embed_tokens.weight", "lm_head.weight")


def new_model(shape: ReplayShape, tokenizer, seed: int, vocabulary: TrainedVocabulary | None = None):
    """The replay model over the tokenizer's ids, or with `vocabulary` the model that training
    runs: the same with only the used ids, renumbered densely (special ids included)."""
    from transformers import AutoModelForImageTextToText

    config = model_config(shape, tokenizer)
    if vocabulary is not None:
        rows = vocabulary.rows(len(tokenizer))
        for name in _VISION_IDS:
            setattr(config, name, int(rows[getattr(config, name)]))
        for name in _TEXT_IDS:
            setattr(config.text_config, name, int(rows[getattr(config.text_config, name)]))
        config.text_config.vocab_size = vocabulary.size
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return model


def full_vocabulary_model(trained, shape: ReplayShape, tokenizer, vocabulary: TrainedVocabulary):
    """The trained dense-vocabulary model as a model over every tokenizer id (what is saved)."""
    model = new_model(shape, tokenizer, seed=0)
    rows = vocabulary.rows(len(tokenizer))
    state = trained.state_dict()
    for key in _VOCAB_WEIGHTS:
        state[key] = state[key][rows]
    model.load_state_dict(state)
    return model


class _MatmulPatchProjection(torch.nn.Conv3d):
    """Qwen2.5-VL's patch embedding with its convolution computed as the matmul it is.

    The kernel equals the stride equals the input patch, so the Conv3d is a linear map of each
    flattened patch; oneDNN's bf16 Conv3d backward took 37 % of a training step on this CPU
    (forward another 11 %), the matmul form ~50 times less. Same parameter and state-dict key,
    so saved weights load into the stock module."""

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        flat = patches.reshape(patches.shape[0], -1)
        return F.linear(flat, self.weight.reshape(self.out_channels, -1), self.bias)


def use_matmul_patch_projection(model) -> None:
    """For training only: the stock module stays in every saved or loaded model."""
    embed = model.model.visual.patch_embed
    stock = embed.proj
    faster = _MatmulPatchProjection(
        stock.in_channels, stock.out_channels, kernel_size=stock.kernel_size, stride=stock.stride,
        bias=stock.bias is not None, device=stock.weight.device, dtype=stock.weight.dtype,
    )
    faster.weight = stock.weight
    faster.bias = stock.bias
    embed.proj = faster


@torch.no_grad()
def standardise_image_features(model, examples: Sequence) -> None:
    """Rescale the tower's last layer so that its features over these images have zero mean and
    unit variance in every dimension. At initialisation the features of all images share one
    large component (their mean features had a cosine of 0.99 on the olmOCR pages); without it the
    differences between images are what the language model sees. An affine change of an affine
    layer: the architecture and every other weight stay as they are."""
    features = torch.cat([e.image_features for e in examples])
    mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
    last = model.model.visual.merger.mlp[-1]
    last.weight.div_(std[:, None])
    last.bias.sub_(mean).div_(std)


@torch.no_grad()
def with_image_features(model, examples: Sequence) -> list:
    """The examples with their (fixed) vision tower output, computed as inference computes it:
    the stock tower in float32, one image at a time."""
    visual = model.model.visual
    return [
        replace(e, image_features=visual(e.pixel_values, grid_thw=e.image_grid_thw).pooler_output.float())
        for e in examples
    ]


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model_dir(model, processor, model_dir: Path) -> None:
    """Weights, config, tokenizer and processor: what `load_target(model_dir)` reads."""
    model.save_pretrained(model_dir)
    processor.save_pretrained(model_dir)


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def built_recipe(model_dir: str | Path) -> Recipe:
    """The recipe the replay model in `model_dir` was built on: the makers' recipe of the model it
    stands for, or the family's default."""
    return recipe_named(replay_recipe(model_dir) or "", FAMILY)


def recipe_layout(recipe: Recipe) -> ChatLayout:
    """The chat turns as the recipe lays them out, as `hsd convert` will read the model."""
    return ChatLayout(image_first=image_first(recipe.prompt), system=recipe.prompt.system)
