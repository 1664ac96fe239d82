"""Parts of the small models built here, offline, for tests, benchmarks and replay models.

Byte-level BPE tokenizers trained on a fixed offline corpus with each family's special tokens
(`build_tiny_tokenizer`; the tokens in tiny_tokens.py), the shared text settings, the Qwen2.5-VL
config that both the tiny random models (`hsd_cli.models.tiny_families`) and the replay models
(`hsd_cli.replay.model`) use, and real-size random models to price forwards (`random_target`).
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path

import torch

from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.models.tiny_tokens import QWEN_TOKENS, TinyTokens


_PROSE = (
    "The quick brown fox jumps over the lazy dog. A document page holds titles, paragraphs, "
    "lists, tables, formulas, figures and captions. Each block is read in order, from the top "
    "left to the bottom right, and written out as Markdown. Numbers such as 3.14, 2026 and 42 "
    "appear in dates, prices and references; names such as Alice, Bob and Carol appear in text. "
    "Simple is better than complex, and readability counts. In the face of ambiguity, refuse the "
    "temptation to guess. Errors should never pass silently. Now is better than never."
)

_MARKUP = (
    "# Title\n\n## Section 1.2\n\nSome **bold** text and *italic* text, a [link](http://x.org).",
    "| a | b |\n|---|---|\n| 1 | 2 |\n<table><tr><td>cell</td></tr></table>",
    "$x^2 + y^2 = z^2$ and $$\\frac{a}{b} \\sum_{i=1}^{n} \\alpha_i$$",
)


def offline_text(*documented: object) -> list[str]:
    """General text available offline: the docstrings of `documented` and of str, list and dict,
    and a run of numbers."""
    return [item.__doc__ or "" for item in (*documented, str, list, dict)] + [" ".join(str(n) for n in range(0, 2000, 7))]


def _tokenizer_corpus() -> list[str]:
    """The tiny tokenizers' fixed corpus: prose, Python docstrings, Markdown, LaTeX and digits."""
    return [_PROSE, *offline_text(json.dumps, string.Formatter), *_MARKUP]


def build_tiny_tokenizer(
    tokens: TinyTokens = QWEN_TOKENS,
    vocab_size: int = 1024,
    corpus: Sequence[str] | None = None,
    min_frequency: int = 0,
):
    """A byte-level BPE trained offline on `corpus` (default: a fixed one), with the family's
    special tokens. Every byte is a token, so any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=tokens.all,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_tokenizer_corpus() if corpus is None else corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=tokens.eos,
        pad_token=tokens.pad,
        extra_special_tokens={
            "image_token": tokens.image,
            "video_token": tokens.video,
            "image_start_token": tokens.vision_start,
            "image_end_token": tokens.vision_end,
            **dict(tokens.named),
        },
        additional_special_tokens=[t for t in tokens.all if t not in (tokens.eos, tokens.pad)],
    )
    tokenizer.chat_template = tokens.chat_template or None  # none, as in GOT-OCR 2.0's checkpoint
    return tokenizer


# ----------------------------------------------------------------------------------------------
# Configs


def text_settings(
    tokenizer,
    tokens: TinyTokens,
    *,
    width: int,
    layers: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    max_positions: int,
    mrope_section: Sequence[int],
) -> dict:
    """A VLM's `text_config` settings: sizes, MRoPE split and the tokenizer's special ids."""
    ids = tokenizer.convert_tokens_to_ids
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=width // heads,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(mrope_section)},
        bos_token_id=ids(tokens.pad),
        eos_token_id=ids(tokens.eos),
        pad_token_id=ids(tokens.pad),
    )


def vision_token_settings(tokenizer, tokens: TinyTokens) -> dict:
    """The ids of the image, video and vision delimiter tokens, as Qwen-style configs name them."""
    ids = tokenizer.convert_tokens_to_ids
    return dict(
        image_token_id=ids(tokens.image),
        video_token_id=ids(tokens.video),
        vision_start_token_id=ids(tokens.vision_start),
        vision_end_token_id=ids(tokens.vision_end),
    )


def qwen25_vl_config(
    tokenizer,
    text: dict,
    *,
    depth: int,
    width: int,
    heads: int,
    ffn: int,
    patch_size: int,
    merge_size: int,
    window_size: int,
    full_attention_blocks: Sequence[int],
):
    """A Qwen2.5-VL config around `text` (see `text_settings`) with a vision tower of these sizes."""
    from transformers import Qwen2_5_VLConfig

    vision = dict(
        depth=depth,
        hidden_size=width,
        intermediate_size=ffn,
        num_heads=heads,
        out_hidden_size=text["hidden_size"],
        patch_size=patch_size,
        spatial_merge_size=merge_size,
        temporal_patch_size=2,
        window_size=window_size,
        fullatt_block_indexes=list(full_attention_blocks),
    )
    return Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, **vision_token_settings(tokenizer, QWEN_TOKENS), tie_word_embeddings=False
    )


def architecture_config(name_or_path: str) -> dict:
    """A real architecture's config.json: a name from configs/architectures (e.g. qwen2_5_vl_7b)
    or a path to a config.json."""
    from importlib.resources import files

    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return json.loads(path.read_text())
    shipped = files("hsd_cli.configs") / "architectures" / f"{name_or_path}.json"
    if not shipped.is_file():
        known = sorted(entry.name.removesuffix(".json") for entry in (files("hsd_cli.configs") / "architectures").iterdir() if entry.name.endswith(".json"))
        raise ValueError(f"no architecture {name_or_path!r}; known: {', '.join(known)} (or a path to a config.json)")
    return json.loads(shipped.read_text())


def random_target(name_or_path: str, *, device: str | None = None, dtype: str = "float32", seed: int = 0):
    """A real-size model with random weights (`architecture_config`), as a decoding target, to
    measure what its forwards cost here. The tokenizer is a tiny one: the embedding and output
    layers keep the architecture's vocabulary size, so their cost is the real one."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hsd_cli.decoding.hf_target.devices import DTYPES, default_device
    from hsd_cli.decoding.hf_target import HFTarget

    settings = architecture_config(name_or_path)
    family = settings.pop("model_type")
    settings.pop("_comment", None)  # what a shaped (not published) architecture is
    if family not in ("qwen2_vl", "qwen2_5_vl", "qwen3_5"):
        raise ValueError(f"--random-weights builds Qwen2-VL, Qwen2.5-VL and Qwen3.5 architectures, not {family}")
    tokenizer = build_tiny_tokenizer(QWEN_TOKENS)
    ids = tokenizer.convert_tokens_to_ids
    special = dict(bos_token_id=ids(QWEN_TOKENS.pad), eos_token_id=ids(QWEN_TOKENS.eos), pad_token_id=ids(QWEN_TOKENS.pad))
    settings.update(vision_token_settings(tokenizer, QWEN_TOKENS))
    # Qwen3.5 nests its text settings; Qwen2-VL and Qwen2.5-VL keep them at the top.
    settings.get("text_config", settings).update(special)
    config = AutoConfig.for_model(family, **settings)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=DTYPES[dtype])
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.to(device or default_device()).eval()
    processor = adapter_for(family).new_processor(tokenizer, patch_size=config.vision_config.patch_size)
    return HFTarget(model, processor, adapter_for(family))
