"""What differs between model families: processors, chat prompts, positions (1-D or M-RoPE with
its rope deltas), image inputs, vision and stop tokens. One small `FamilyAdapter` per family (a
module per kind of positions, or per family where it needs more); `adapter_for(model_type)` picks it,
or refuses a family it does not decode yet (`REFUSED`) with the reason."""

from __future__ import annotations

from .base import IMAGE_FIRST, ChatLayout, FamilyAdapter
from .deepseek_ocr2 import DeepseekOcr2Adapter
from .kosmos2_5 import Kosmos25Adapter
from .mrope import GlmOcrAdapter, HunYuanVLAdapter, PaddleOCRVLAdapter, Qwen2VLAdapter, Qwen3VLAdapter, Qwen25VLAdapter, Qwen35Adapter
from .one_d import GotOcr2Adapter, Idefics3Adapter, LightOnOcrAdapter, QianfanOcrAdapter, got_ocr2_image_tokens
from .one_d import Granite4VisionAdapter, GraniteDoclingAdapter, Mistral3Adapter
from .unlimited_ocr import UnlimitedOcrAdapter

__all__ = ["ADAPTERS", "IMAGE_FIRST", "REFUSED", "ChatLayout", "FamilyAdapter", "UnsupportedFamilyError", "adapter_for", "got_ocr2_image_tokens"]

ADAPTERS: dict[str, FamilyAdapter] = {
    t: a
    for a in (
        Qwen2VLAdapter(), Qwen25VLAdapter(), Qwen3VLAdapter(), Qwen35Adapter(), PaddleOCRVLAdapter(), HunYuanVLAdapter(), GlmOcrAdapter(),
        Idefics3Adapter(), LightOnOcrAdapter(), QianfanOcrAdapter(), GotOcr2Adapter(),
        Kosmos25Adapter(), DeepseekOcr2Adapter(),
        Mistral3Adapter(), GraniteDoclingAdapter(), Granite4VisionAdapter(), UnlimitedOcrAdapter(),
    )
    for t in a.model_types
}


def _minicpm(text_model: str, processor: str) -> str:
    # The text model is one the target verifies trees of (hybrid.py, as for qwen3_5); what is
    # missing is the family's adapter and tiny recipe.
    return (
        f"its text model ({text_model}) has Gated DeltaNet linear-attention layers, which hsd verifies as for qwen3_5, "
        f"but no adapter reads this family yet: {processor}, and its model encodes only a batched prefill's first image"
    )


# Model types that OCR users run but that hsd does not decode yet, with the reason `adapter_for`
# and `hsd models` give (README lists the models behind each).
_MINICPM_V = "its processor slices pages and numbers images with id tokens"
REFUSED: dict[str, str] = {
    "minicpm_ocr": _minicpm("qwen3_5_text", "its image processor has only a torchvision backend"),
    "minicpmv4_6": _minicpm("qwen3_5_text", _MINICPM_V),
    "minicpmv4_7": _minicpm("qwen3_5_text", _MINICPM_V),
}


class UnsupportedFamilyError(ValueError):
    """A model family with no adapter, or refused; the message is one line."""


def adapter_for(model_type: str) -> FamilyAdapter:
    if model_type in REFUSED:
        raise UnsupportedFamilyError(
            f"model family {model_type!r} cannot be decoded losslessly by hsd: {REFUSED[model_type]}"
        )
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise UnsupportedFamilyError(f"model family {model_type!r} is not supported; supported: {sorted(ADAPTERS)}") from None
