"""What differs between model families: processors, chat prompts, positions (1-D or M-RoPE with
its rope deltas), image inputs, vision and stop tokens. One small `FamilyAdapter` per family (a
module per kind of positions, or per family where it needs more); `adapter_for(model_type)` picks it,
or names the families it knows when there is none."""

from __future__ import annotations

from .base import IMAGE_FIRST, ChatLayout, FamilyAdapter
from .deepseek_ocr2 import DeepseekOcr2Adapter
from .kosmos2_5 import Kosmos25Adapter
from .minicpm import MiniCPMOcrAdapter, MiniCPMV46Adapter, MiniCPMV47Adapter
from .mrope import GlmOcrAdapter, HunYuanVLAdapter, PaddleOCRVLAdapter, Qwen2VLAdapter, Qwen3VLAdapter, Qwen25VLAdapter, Qwen35Adapter
from .one_d import (
    GotOcr2Adapter, Granite4VisionAdapter, GraniteDoclingAdapter, Idefics3Adapter, LightOnOcrAdapter, Mistral3Adapter, QianfanOcrAdapter,
    got_ocr2_image_tokens,
)
from .unlimited_ocr import UnlimitedOcrAdapter

__all__ = ["ADAPTERS", "IMAGE_FIRST", "ChatLayout", "FamilyAdapter", "UnsupportedFamilyError", "adapter_for", "got_ocr2_image_tokens"]

ADAPTERS: dict[str, FamilyAdapter] = {
    t: a
    for a in (
        Qwen2VLAdapter(), Qwen25VLAdapter(), Qwen3VLAdapter(), Qwen35Adapter(), PaddleOCRVLAdapter(), HunYuanVLAdapter(), GlmOcrAdapter(),
        Idefics3Adapter(), LightOnOcrAdapter(), QianfanOcrAdapter(), GotOcr2Adapter(),
        Kosmos25Adapter(), DeepseekOcr2Adapter(),
        Mistral3Adapter(), GraniteDoclingAdapter(), Granite4VisionAdapter(),
        MiniCPMOcrAdapter(), MiniCPMV46Adapter(), MiniCPMV47Adapter(),
        UnlimitedOcrAdapter(),
    )
    for t in a.model_types
}


class UnsupportedFamilyError(ValueError):
    """A model family with no adapter; the message is one line."""


def adapter_for(model_type: str) -> FamilyAdapter:
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise UnsupportedFamilyError(f"model family {model_type!r} is not supported; supported: {sorted(ADAPTERS)}") from None
