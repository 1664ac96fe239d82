"""Unlimited-OCR (baidu/Unlimited-OCR): a SAM encoder feeding a CLIP-style encoder over a
DeepSeek-V2-style mixture-of-experts text model with plain 1-D positions, whose attention is
reference sliding-window attention (R-SWA): every token sees the whole prompt and only the last
`sliding_window` generated tokens. hsd keeps every slot and hides what the window leaves out in
its masks (generated_window.py); the router and attention are otherwise DeepSeek-OCR-2's (see
deepseek_ocr2.py: exact under tree forwards).

transformers' image processor for it has a torchvision backend only; this module's PIL one
follows it step for step (tiles of the optimal canvas, a global view resized and padded to a
square), so hsd needs no torchvision. Its pixels can differ from the torchvision ones by
resampling rounding: what hsd and its `generate` baseline both read.
"""

from __future__ import annotations

import json
from functools import cache

from .base import FamilyAdapter, model_file, processor_chat_template

# The image processor's settings a checkpoint may give, beyond the base ones.
_IMAGE_SETTINGS = (
    "size", "resample", "do_resize", "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std",
    "crop_to_patches", "min_patches", "max_patches", "tile_size", "background_color", "maximum_pad_value",
)


def pil_image_processor(**settings):
    """UnlimitedOcrImageProcessor's steps with PIL (see the module's docstring)."""
    return _pil_image_processor_class()(**settings)


@cache
def _pil_image_processor_class() -> type:
    # transformers is imported when a processor is made, not with the families.
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import SizeDict, get_image_size
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import (
        DeepseekOcr2ImageProcessorKwargs,
        DeepseekOcr2ImageProcessorPil,
        get_optimal_tiled_canvas,
    )

    class UnlimitedOcrImageProcessorKwargs(DeepseekOcr2ImageProcessorKwargs, total=False):
        maximum_pad_value: int

    class UnlimitedOcrImageProcessorPil(DeepseekOcr2ImageProcessorPil):
        """DeepSeek-OCR-2's tiles and padded global view, with Unlimited-OCR's defaults (2 to 32
        tiles of 640 pixels), the tile grid it returns, a global view as large as the larger side
        of `size`, and small images resized to a square where not tiled."""

        valid_kwargs = UnlimitedOcrImageProcessorKwargs
        max_patches = 32
        tile_size = 640
        maximum_pad_value = 640
        model_input_names = ["pixel_values", "num_local_patches", "patches_grid"]

        def _preprocess(self, images, size, resample, do_rescale, rescale_factor, do_normalize, image_mean, image_std,
                        return_tensors, crop_to_patches=True, min_patches=2, max_patches=32, tile_size=640,
                        background_color=None, maximum_pad_value=640, **kwargs) -> BatchFeature:
            background_color = self.background_color if background_color is None else background_color
            scaled = lambda image: self._scaled(image, do_rescale, rescale_factor, do_normalize, image_mean, image_std)  # noqa: E731
            local, global_views, counts, grids = [], [], [], []
            side = max(size.height, size.width)
            for image in images:
                height, width = get_image_size(image)
                if crop_to_patches and max(height, width) > tile_size:
                    grids.append(list(get_optimal_tiled_canvas((height, width), (tile_size, tile_size), min_patches, max_patches)))
                    patches = self.crop_image_to_patches(image, min_patches, max_patches, tile_size, resample=resample)
                    local += [scaled(patch) for patch in patches]
                    counts.append(len(patches))
                else:
                    grids.append([1, 1])
                    counts.append(0)
                if not crop_to_patches and side <= maximum_pad_value:
                    view = self.resize(image, SizeDict(height=side, width=side), resample=resample)
                else:
                    scale = side / max(height, width)
                    view = self.resize(image, SizeDict(height=round(height * scale), width=round(width * scale)), resample=resample)
                    view = self.pad_to_square(view, background_color=background_color)
                global_views.append(scaled(view))
            data = {"pixel_values": global_views, "num_local_patches": counts, "patches_grid": grids}
            if local:
                data["pixel_values_local"] = local
            return BatchFeature(data=data, tensor_type=return_tensors, skip_tensor_conversion=["num_local_patches", "patches_grid"])

        def _scaled(self, image, do_rescale, rescale_factor, do_normalize, image_mean, image_std):
            image = self.rescale(image, rescale_factor) if do_rescale else image
            return self.normalize(image, image_mean, image_std) if do_normalize else image

    return UnlimitedOcrImageProcessorPil


class UnlimitedOcrAdapter(FamilyAdapter):
    """Unlimited-OCR: UnlimitedOcrProcessor with the checkpoint's chat template and the PIL image
    processor above. Its <|det|> tags around each block's label and box are left out of the text,
    as its processor's decode leaves them out."""

    model_types = ("unlimited_ocr",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer, UnlimitedOcrProcessor

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        settings = _json(path, "processor_config.json")
        counts = {name: settings[name] for name in ("patch_size", "downsample_ratio") if name in settings}
        image_settings = settings.get("image_processor") or _json(path, "preprocessor_config.json")
        image_processor = pil_image_processor(**{k: v for k, v in image_settings.items() if k in _IMAGE_SETTINGS})
        template = processor_chat_template(path) or tokenizer.chat_template
        return UnlimitedOcrProcessor(image_processor, tokenizer, chat_template=template, **counts)

    def vision_token_ids(self, config) -> list[int]:
        return [config.image_token_id]


def _json(path: str, name: str) -> dict:
    file = model_file(path, name)
    return json.loads(file.read_text()) if file is not None else {}
