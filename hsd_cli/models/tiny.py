"""Small models built here, offline, for tests, benchmarks and replay models.

Tiny random models of every supported family (`build_tiny_random`), byte-level BPE tokenizers
trained on a fixed offline corpus with each family's special tokens (`build_tiny_tokenizer`; the
tokens in tiny_tokens.py), and the Qwen2.5-VL config that both the tiny models and the replay
models (`hsd_cli.replay.model`) use.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path

import torch

from hsd_cli.decoding.target.families import adapter_for
from hsd_cli.models.tiny_tokens import QWEN_TOKENS, TINY_FAMILIES, TINY_TOKENS, TinyTokens


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


def _tiny_config(family: str, tokenizer, tokens: TinyTokens):
    # head_dim 16 -> 8 rotary frequencies split over the (temporal, height, width) axes.
    text = text_settings(
        tokenizer, tokens, width=64, layers=2, heads=4, kv_heads=2, ffn=128, max_positions=4096, mrope_section=[2, 3, 3]
    )
    # Larger init than the real 0.02 so a random model's greedy text depends on its context
    # instead of falling into a short loop at once.
    text["initializer_range"] = 0.3
    common = dict(vision_token_settings(tokenizer, tokens), tie_word_embeddings=False)
    if family == "qwen2_5_vl":
        return qwen25_vl_config(
            tokenizer, text, depth=2, width=32, heads=2, ffn=64, patch_size=14, merge_size=2, window_size=56, full_attention_blocks=[1]
        )
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig

        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
        return Qwen2VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig

        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, spatial_merge_size=2, out_hidden_size=64,
            patch_size=16, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[1],
        )
        return Qwen3VLConfig(text_config=text, vision_config=vision, **common)
    if family == "paddleocr_vl":
        from transformers import PaddleOCRVLConfig

        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            patch_size=14, image_size=56, spatial_merge_size=2,
        )
        return PaddleOCRVLConfig(text_config=text, vision_config=vision, **common)
    if family == "hunyuan_vl":
        from transformers import HunYuanVLConfig

        # Four XD-RoPE axes as in HunyuanOCR: (sequence, width, height, image index).
        text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=[2, 2, 2, 2])
        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            out_hidden_size=64, text_hidden_size=64, patch_size=16, spatial_merge_size=2,
        )
        return HunYuanVLConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=common["image_token_id"],
            im_start_id=common["vision_start_token_id"],
            im_end_id=common["vision_end_token_id"],
            im_newline_id=tokenizer.convert_tokens_to_ids("<｜hy_newline｜>"),
            tie_word_embeddings=False,
        )
    if family == "glm_ocr":
        from transformers import GlmOcrConfig

        ids = tokenizer.convert_tokens_to_ids
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        )
        return GlmOcrConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=ids(tokens.image),
            video_token_id=ids(tokens.video),
            image_start_token_id=ids(tokens.vision_start),
            image_end_token_id=ids(tokens.vision_end),
            video_start_token_id=ids("<|begin_of_video|>"),
            video_end_token_id=ids("<|end_of_video|>"),
            tie_word_embeddings=False,
        )
    if family == "idefics3":
        from transformers import Idefics3Config

        llama = dict(text, model_type="llama")
        del llama["rope_parameters"]  # plain 1-D RoPE
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
        return Idefics3Config(
            text_config=llama, vision_config=vision, image_token_id=common["image_token_id"], scale_factor=2, tie_word_embeddings=False
        )
    if family == "lighton_ocr":
        from transformers import LightOnOcrConfig

        qwen3 = dict(text, model_type="qwen3")
        del qwen3["rope_parameters"]  # plain 1-D RoPE
        vision = dict(
            model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            head_dim=16, image_size=112, patch_size=14,
        )
        # Tied input and output embeddings, as in LightOnOCR's own config.
        return LightOnOcrConfig(text_config=qwen3, vision_config=vision, image_token_id=common["image_token_id"], spatial_merge_size=2)
    if family == "qianfan_ocr":
        from transformers import QianfanOCRConfig

        qwen3 = dict(text, model_type="qwen3")
        del qwen3["rope_parameters"]  # plain 1-D RoPE
        # 56-pixel tiles of 14-pixel patches: 16 patches, pixel-shuffled (x0.5) to 4 tokens a tile.
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14)
        return QianfanOCRConfig(
            text_config=qwen3, vision_config=vision, image_token_id=common["image_token_id"], image_seq_length=4,
            downsample_ratio=0.5, tie_word_embeddings=False,
        )
    if family == "got_ocr2":
        from transformers import GotOcr2Config

        qwen2 = dict(text, model_type="qwen2")
        del qwen2["rope_parameters"]  # plain 1-D RoPE
        # 128-pixel tiles of 8-pixel patches: a 16 x 16 grid, 4 x 4 after the projector = 16 image tokens.
        vision = dict(
            hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2, mlp_dim=64,
            image_size=128, patch_size=8, window_size=4, global_attn_indexes=[1],
        )
        # Tied input and output embeddings, as in GOT-OCR 2.0's own config.
        return GotOcr2Config(text_config=qwen2, vision_config=vision, image_token_index=common["image_token_id"], image_seq_length=16)
    raise ValueError(f"no tiny recipe for {family!r}; known: {TINY_FAMILIES}")


def _tiny_processor(family: str, tokenizer, config):
    """The family's processor with an image processor that makes 4 to 16 merged image tokens."""
    if family == "idefics3":
        from transformers import Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        # One 32-pixel image, no splitting: (32 / 8)^2 patches / scale_factor^2 = 4 image tokens.
        side = {"longest_edge": config.vision_config.image_size}
        image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size=side, max_image_size=side)
        return Idefics3Processor(image_processor, tokenizer, image_seq_len=4, chat_template=tokenizer.chat_template)
    if family == "lighton_ocr":
        from transformers import LightOnOcrProcessor
        from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

        # Images resized in steps of merged patches, at most 112 pixels a side: at most 16 image tokens.
        merged = config.vision_config.patch_size * config.spatial_merge_size
        image_processor = PixtralImageProcessorPil(patch_size=merged, size={"longest_edge": config.vision_config.image_size})
        return LightOnOcrProcessor(
            image_processor, tokenizer, patch_size=config.vision_config.patch_size,
            spatial_merge_size=config.spatial_merge_size, chat_template=tokenizer.chat_template,
        )
    if family == "qianfan_ocr":
        from transformers import QianfanOCRProcessor
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

        # Tiles of the vision tower's size, at most 3 and a thumbnail: 4 to 16 image tokens.
        side = config.vision_config.image_size[0]
        image_processor = GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=True, max_patches=3)
        return QianfanOCRProcessor(
            image_processor, tokenizer, image_seq_length=config.image_seq_length, chat_template=tokenizer.chat_template
        )
    if family == "got_ocr2":
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

        from hsd_cli.decoding.target.families import got_ocr2_image_tokens

        side = config.vision_config.image_size
        image_processor = GotOcr2ImageProcessorPil(size={"height": side, "width": side})
        return adapter_for(family).new_processor(tokenizer, image_processor, got_ocr2_image_tokens(side, config.vision_config.patch_size))
    patch = config.vision_config.patch_size
    merged = patch * config.vision_config.spatial_merge_size
    least, most = (2 * merged) ** 2, (4 * merged) ** 2
    if family == "glm_ocr":
        # GLM's image processor takes its pixel bounds as size edges, counting both frames of a
        # temporal patch (x2).
        pixels = dict(size={"shortest_edge": 2 * least, "longest_edge": 2 * most})
    else:
        pixels = dict(min_pixels=least, max_pixels=most)
    return adapter_for(family).new_processor(tokenizer, patch_size=patch, **pixels)


def build_tiny_random(family: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Build a tiny random model + processor of `family`, save both to `out_dir`, return it.

    The rows of the LM head for special tokens are zeroed so greedy decoding never ends on
    its own: logits of random rows are spread around 0, so a zero logit is never the argmax.
    (Where the embeddings are tied, as in LightOnOCR, those tokens' input embeddings are zero.)
    """
    from transformers import AutoModelForImageTextToText

    out_dir = Path(out_dir)
    tokens = TINY_TOKENS.get(family, QWEN_TOKENS)
    tokenizer = build_tiny_tokenizer(tokens)
    config = _tiny_config(family, tokenizer, tokens)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for token in tokens.all:
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(token)].zero_()
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.save_pretrained(out_dir)
    _tiny_processor(family, tokenizer, config).save_pretrained(out_dir)
    return out_dir


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

    from hsd_cli.decoding.target.devices import DTYPES, default_device
    from hsd_cli.decoding.target import HFTarget

    settings = architecture_config(name_or_path)
    family = settings.pop("model_type")
    if family not in ("qwen2_vl", "qwen2_5_vl"):
        raise ValueError(f"--random-weights builds Qwen2-VL and Qwen2.5-VL architectures, not {family}")
    tokenizer = build_tiny_tokenizer(QWEN_TOKENS)
    ids = tokenizer.convert_tokens_to_ids
    settings.update(vision_token_settings(tokenizer, QWEN_TOKENS), bos_token_id=ids(QWEN_TOKENS.pad),
                    eos_token_id=ids(QWEN_TOKENS.eos), pad_token_id=ids(QWEN_TOKENS.pad))
    config = AutoConfig.for_model(family, **settings)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=DTYPES[dtype])
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.to(device or default_device()).eval()
    processor = adapter_for(family).new_processor(tokenizer, patch_size=config.vision_config.patch_size)
    return HFTarget(model, processor, adapter_for(family))
