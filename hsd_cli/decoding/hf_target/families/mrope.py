"""Families with M-RoPE positions (several position axes; text after an image shifted by a
per-row rope delta): Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (and MoE), PaddleOCR-VL, HunyuanOCR, GLM-OCR."""

from __future__ import annotations

import torch

from .base import GLM_VISION_TOKENS, PartsProcessorAdapter, image_only_processor_class, rope_index_positions


class QwenVLAdapter(PartsProcessorAdapter):
    """Qwen2-VL and Qwen2.5-VL: MRoPE with 3 position rows and a per-sequence rope delta."""

    model_types = ("qwen2_vl", "qwen2_5_vl")

    def _processor_base(self) -> type:
        from transformers import Qwen2_5_VLProcessor

        return Qwen2_5_VLProcessor

    def _processor_class(self) -> type:
        return image_only_processor_class(self._processor_base())

    def _image_processor_class(self) -> type:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs.get("image_grid_thw") is None:
            return super().prefill_positions(model, inputs)
        return rope_index_positions(model, inputs, "image_grid_thw")

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        # Text tokens after the image use the same position on every MRoPE axis.
        return positions.unsqueeze(0).expand(self.rope_axes(model), -1, -1)

    def rope_axes(self, model) -> int:
        return 3


class Qwen2VLAdapter(QwenVLAdapter):
    model_types = ("qwen2_vl",)

    def _processor_base(self) -> type:
        from transformers import Qwen2VLProcessor

        return Qwen2VLProcessor


class Qwen25VLAdapter(QwenVLAdapter):
    model_types = ("qwen2_5_vl",)


class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL: interleaved MRoPE and deepstack vision features; the same position rule."""

    model_types = ("qwen3_vl",)

    def _processor_base(self) -> type:
        from transformers import Qwen3VLProcessor

        return Qwen3VLProcessor


class Qwen35Adapter(Qwen3VLAdapter):
    """Qwen3.5 (Chandra 2) and Qwen3.5-MoE: Qwen3-VL's processor and interleaved M-RoPE (text
    tokens carry their position on all three axes) over a hybrid text model, whose Gated DeltaNet
    layers the target verifies trees with (hybrid.py)."""

    model_types = ("qwen3_5", "qwen3_5_moe")


class PaddleOCRVLAdapter(QwenVLAdapter):
    """PaddleOCR-VL: Qwen-style 3-axis MRoPE over an ERNIE text model; no video processor."""

    model_types = ("paddleocr_vl",)

    def _processor_class(self) -> type:
        from transformers import PaddleOCRVLProcessor

        return PaddleOCRVLProcessor

    def _image_processor_class(self) -> type:
        from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

        return PaddleOCRVLImageProcessorPil


class HunYuanVLAdapter(QwenVLAdapter):
    """HunYuanVL (HunyuanOCR): XD-RoPE with as many axes as `mrope_section` has entries (4 in
    HunyuanOCR); text tokens carry their sequence position on every axis."""

    model_types = ("hunyuan_vl",)

    def rope_axes(self, model) -> int:
        return len(model.config.text_config.rope_parameters["mrope_section"])

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers numbers images across the whole batch on the image-index axis: a row's
        # image would get its batch position as index, and other logits than decoded alone.
        if inputs.get("image_grid_thw") is None or inputs["input_ids"].shape[0] == 1:
            return super().prefill_positions(model, inputs)
        images_per_row = (inputs["input_ids"] == model.config.im_start_id).sum(-1).tolist()
        grids = inputs["image_grid_thw"].split(images_per_row)
        rows = [
            super(HunYuanVLAdapter, self).prefill_positions(model, {
                "input_ids": inputs["input_ids"][b : b + 1],
                "mm_token_type_ids": inputs["mm_token_type_ids"][b : b + 1],
                "attention_mask": inputs["attention_mask"][b : b + 1],
                "image_grid_thw": grid if len(grid) else None,
            })
            for b, grid in enumerate(grids)
        ]
        return torch.cat([positions for positions, _ in rows], dim=1), torch.cat([deltas for _, deltas in rows])

    def vision_token_ids(self, config) -> list[int]:
        return [config.image_token_id, config.im_start_id, config.im_end_id, config.im_newline_id]

    def _processor_class(self) -> type:
        from transformers import HunYuanVLProcessor

        return HunYuanVLProcessor

    def _image_processor_class(self) -> type:
        from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil

        return HunYuanVLImageProcessorPil


class GlmOcrAdapter(QwenVLAdapter):
    """GLM-OCR: GLM-4V-style 3-axis M-RoPE with Qwen's position rule (text tokens carry their
    position on every axis, shifted after the image by the row's rope delta); GLM-4.6V's processor
    without its video processor."""

    model_types = ("glm_ocr",)

    def _processor_class(self) -> type:
        from transformers import Glm46VProcessor

        return image_only_processor_class(Glm46VProcessor, GLM_VISION_TOKENS)

    def _image_processor_class(self) -> type:
        from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil

        return Glm46VImageProcessorPil

    def vision_token_ids(self, config) -> list[int]:
        names = ("image", "video", "image_start", "image_end", "video_start", "video_end")
        return [getattr(config, f"{name}_token_id") for name in names]

    def stop_token_ids(self, model, tokenizer) -> list[int]:
        # GLM chats have no end-of-turn token: a reply ends where the next turn's role token
        # would start, so those end it even if the generation config does not name them.
        ids = super().stop_token_ids(model, tokenizer)
        vocabulary = tokenizer.get_vocab()
        return ids + [vocabulary[t] for t in ("<|user|>", "<|observation|>") if t in vocabulary and vocabulary[t] not in ids]
