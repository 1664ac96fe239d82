"""What a tiny random model of a family is built from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hsd_cli.models.tiny_tokens import QWEN_TOKENS, TinyTokens


@dataclass(frozen=True)
class TinyRecipe:
    """`config(tokenizer, tokens, text, common)`: the family's config around the shared tiny text
    settings `text` (`tiny.text_settings`) and `common` (vision token ids, untied embeddings);
    `processor(tokenizer, config)`: its processor, making 4 to 16 merged image tokens an image;
    `weights(model)`: what the family changes in its random weights after they are drawn (None:
    nothing)."""

    config: Callable[[Any, TinyTokens, dict, dict], Any]
    processor: Callable[[Any, Any], Any]
    tokens: TinyTokens = QWEN_TOKENS
    weights: Callable[[Any], None] | None = None
