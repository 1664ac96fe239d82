"""What differs between model families: processors, chat prompts, positions (1-D or M-RoPE with
its rope deltas), image inputs, vision and stop tokens. One small `FamilyAdapter` per family (a
module per kind of positions, or per family where it needs more); `adapter_for(model_type)` picks it,
or refuses a family the loop cannot decode losslessly (`REFUSED`) with the reason."""

from __future__ import annotations

from .base import IMAGE_FIRST, ChatLayout, FamilyAdapter
from .deepseek_ocr2 import DeepseekOcr2Adapter
from .kosmos2_5 import Kosmos25Adapter
from .mrope import GlmOcrAdapter, HunYuanVLAdapter, PaddleOCRVLAdapter, Qwen2VLAdapter, Qwen3VLAdapter, Qwen25VLAdapter, Qwen35Adapter
from .one_d import GotOcr2Adapter, Idefics3Adapter, LightOnOcrAdapter, QianfanOcrAdapter, got_ocr2_image_tokens

__all__ = ["ADAPTERS", "IMAGE_FIRST", "REFUSED", "ChatLayout", "FamilyAdapter", "UnsupportedFamilyError", "adapter_for", "got_ocr2_image_tokens"]

ADAPTERS: dict[str, FamilyAdapter] = {
    t: a
    for a in (
        Qwen2VLAdapter(), Qwen25VLAdapter(), Qwen3VLAdapter(), Qwen35Adapter(), PaddleOCRVLAdapter(), HunYuanVLAdapter(), GlmOcrAdapter(),
        Idefics3Adapter(), LightOnOcrAdapter(), QianfanOcrAdapter(), GotOcr2Adapter(),
        Kosmos25Adapter(), DeepseekOcr2Adapter(),
    )
    for t in a.model_types
}


def _gated_deltanet(text_model: str) -> str:
    # A linear-attention layer ignores a tree's 4-D mask (transformers gives it padding masks only)
    # and folds each token into one state: there is no entry per node to keep or drop.
    return (
        f"its text model ({text_model}) has Gated DeltaNet linear-attention layers: their recurrent state reads "
        "a draft tree's nodes as one sequence and keeps rejected ones in, with no per-token entry hsd's KV-cache "
        "edits could drop"
    )


# Model types that OCR users run but whose text model the loop cannot decode losslessly, with the
# reason `adapter_for` and `hsd models` give (README lists the models behind each).
REFUSED: dict[str, str] = {
    "minicpm_ocr": _gated_deltanet("qwen3_5_text"),
    "minicpmv4_6": _gated_deltanet("qwen3_5_text"),
    "minicpmv4_7": _gated_deltanet("qwen3_5_text"),
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
