"""What differs between model families: processors, chat prompts, positions (1-D or M-RoPE with
its rope deltas), image inputs, vision and stop tokens. One small `FamilyAdapter` per family (a
module per kind of positions, or per family where it needs more); `adapter_for(model_type)` picks it."""

from __future__ import annotations

from .base import FamilyAdapter
from .mrope import GlmOcrAdapter, HunYuanVLAdapter, PaddleOCRVLAdapter, Qwen2VLAdapter, Qwen3VLAdapter, Qwen25VLAdapter
from .one_d import GotOcr2Adapter, Idefics3Adapter, LightOnOcrAdapter, QianfanOcrAdapter, got_ocr2_image_tokens

__all__ = ["ADAPTERS", "FamilyAdapter", "adapter_for", "got_ocr2_image_tokens"]

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
