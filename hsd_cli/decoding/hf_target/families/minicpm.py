"""MiniCPM-OCR and MiniCPM-V 4.6 / 4.7: a SigLIP-style vision tower (NaViT-packed crops, a window
merger, an MLP merger) over Qwen3.5's hybrid text model, whose Gated DeltaNet layers the target
verifies trees with (hybrid.py).

Their processors slice a large page into a grid of crops after a thumbnail, write
`<image_id>N</image_id>` before each image of a prompt (N counted per row) and pack every crop of
the batch into one sequence (`pixel_values` is (1, C, patch, all patches)): the model's
`pixel_values[:1]` is then every image of a batched prefill, and rows can be prefilled together.
The video processors need torchvision, so the processors are built here without them.

MiniCPM-OCR and MiniCPM-V 4.6 take plain 1-D positions. MiniCPM-V 4.7 lays each image on a canvas
(canvas M-RoPE: three axes; text after it shifted by the row's rope delta). MiniCPM-OCR's image
processor has only a torchvision backend: `MiniCPMOcrImageProcessorTorch` is that class with
torchvision's two kernels it calls (bicubic resize, normalize) restated in torch.
"""

from __future__ import annotations

import torch

from .base import PartsProcessorAdapter, rope_index_positions


def image_only_minicpm_processor(base: type) -> type:
    """`base` (a MiniCPM processor class) without its video processor, which needs torchvision;
    video settings are the image processor's (videos are never sent)."""

    class ImageOnlyProcessor(base):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            # Skip the base __init__ (it reads the video processor) and go to ProcessorMixin's.
            super(base, self).__init__(image_processor, tokenizer, chat_template=chat_template)
            self.slice_mode = self.video_slice_mode = image_processor.slice_mode
            self.default_use_image_id = image_processor.use_image_id
            self.image_token_divisor = self.video_token_divisor = 4 if image_processor.downsample_mode == "4x" else 16
            for name in ("image_token", "video_token", "image_start_token", "image_end_token", "slice_start_token",
                         "slice_end_token", "image_id_start_token", "image_id_end_token"):
                setattr(self, name, getattr(tokenizer, name))
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)

    # Saved processor configs then name the official class, as in a real model directory.
    ImageOnlyProcessor.__name__ = base.__name__
    ImageOnlyProcessor.__qualname__ = f"{base.__name__}ImageOnly"
    return ImageOnlyProcessor


class MiniCPMV46Adapter(PartsProcessorAdapter):
    """MiniCPM-V 4.6: 1-D positions; its image processor's PIL backend."""

    model_types = ("minicpmv4_6",)

    def _processor_class(self) -> type:
        from transformers import MiniCPMV4_6Processor

        return image_only_minicpm_processor(MiniCPMV4_6Processor)

    def _image_processor_class(self) -> type:
        from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

        return MiniCPMV4_6ImageProcessorPil


class MiniCPMOcrAdapter(MiniCPMV46Adapter):
    """MiniCPM-OCR: MiniCPM-V 4.6's layout with 4x more image tokens; 1-D positions; its image
    processor without torchvision (`MiniCPMOcrImageProcessorTorch`)."""

    model_types = ("minicpm_ocr",)

    def _processor_class(self) -> type:
        from transformers import MiniCPMOcrProcessor

        return image_only_minicpm_processor(MiniCPMOcrProcessor)

    def _image_processor_class(self) -> type:
        return minicpm_ocr_image_processor_class()


class MiniCPMV47Adapter(MiniCPMV46Adapter):
    """MiniCPM-V 4.7: MiniCPM-V 4.6's processor and image processor, canvas M-RoPE positions
    (transformers' `get_rope_index`, from the crops' grids and the token types the processor marks)."""

    model_types = ("minicpmv4_7",)

    def _processor_class(self) -> type:
        from transformers import MiniCPMV4_7Processor

        return image_only_minicpm_processor(MiniCPMV4_7Processor)

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs.get("target_sizes") is None:
            return super().prefill_positions(model, inputs)
        return rope_index_positions(model, inputs, "target_sizes")

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        # Text tokens after the canvas carry the same position on its three axes.
        return positions.unsqueeze(0).expand(3, -1, -1)

    def vision_token_ids(self, config) -> list[int]:
        names = ("image_token_id", "video_token_id", "image_start_id", "image_end_id", "slice_start_id", "slice_end_id")
        return [getattr(config, n) for n in names if getattr(config, n, None) is not None]


def minicpm_ocr_image_processor_class() -> type:
    """transformers' MiniCPMOcrImageProcessor (its slicing, adaptive upsizing and packing as they
    are) with the two torchvision kernels it calls restated in torch, as torchvision 0.28's
    `resize_image` and `normalize_image` compute them on a CPU tensor."""
    from transformers.image_utils import PILImageResampling
    from transformers.models.minicpm_ocr.image_processing_minicpm_ocr import MiniCPMOcrImageProcessor

    class MiniCPMOcrImageProcessorTorch(MiniCPMOcrImageProcessor):
        def resize(self, image: torch.Tensor, size, resample=None, antialias: bool = True, **kwargs) -> torch.Tensor:
            if resample not in (PILImageResampling.BICUBIC, int(PILImageResampling.BICUBIC)):
                raise ValueError(f"MiniCPM-OCR's image processor resizes bicubic only, not with {resample!r}")
            height, width = size.height, size.width
            if (height, width) == tuple(image.shape[-2:]):
                return image  # torchvision returns the image itself at its own size
            # On the CPU torchvision resizes uint8 pictures natively (antialiased bicubic in
            # fixed point), floats in float.
            resized = torch.nn.functional.interpolate(
                image.unsqueeze(0), size=[height, width], mode="bicubic", align_corners=False, antialias=antialias
            )
            return resized.squeeze(0)

        def normalize(self, image: torch.Tensor, mean, std, inplace: bool = False, **kwargs) -> torch.Tensor:
            mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            return (image.sub_(mean) if inplace else image.sub(mean)).div_(std)

    MiniCPMOcrImageProcessorTorch.__name__ = MiniCPMOcrImageProcessor.__name__
    return MiniCPMOcrImageProcessorTorch
