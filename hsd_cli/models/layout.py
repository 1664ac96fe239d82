"""Layout models as PaddleOCR-VL-1.6 and GLM-OCR run them: PP-DocLayoutV3 through transformers
(`pp_doclayout_v3`), loaded from a user's directory, on a GPU or the CPU. A page's picture in,
its blocks out: each one's label, score and box in the picture's pixels, in the model's reading
order (its order head), above the makers' threshold (0.3).

The image processor's own class needs torchvision, which hsd does not install: its steps are
done here from its saved settings (preprocessor_config.json: resize to `size`, rescale, normalize)
and its post-processing (transformers' PPDocLayoutV3ImageProcessor.post_process_object_detection,
polygons aside) is restated in `found_blocks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image


@dataclass(frozen=True)
class FoundBlock:
    label: str
    score: float
    box: tuple[float, float, float, float]  # (x0, y0, x1, y1) in the picture's pixels


@dataclass(frozen=True)
class PixelSteps:
    """The processor's steps, from its preprocessor_config.json."""

    size: tuple[int, int]  # (width, height) the picture is resized to
    rescale: float
    mean: tuple[float, ...] | None  # None: not normalized
    std: tuple[float, ...] | None


def pixel_steps(directory: Path) -> PixelSteps:
    saved = json.loads((directory / "preprocessor_config.json").read_text(encoding="utf-8"))
    size = saved.get("size", {"height": 800, "width": 800})
    normalize = saved.get("do_normalize", True)
    return PixelSteps(
        size=(size["width"], size["height"]), rescale=saved.get("rescale_factor", 1 / 255) if saved.get("do_rescale", True) else 1.0,
        mean=tuple(saved.get("image_mean", (0.0, 0.0, 0.0))) if normalize else None,
        std=tuple(saved.get("image_std", (1.0, 1.0, 1.0))) if normalize else None,
    )


def pixel_values(picture: Image.Image, steps: PixelSteps) -> torch.Tensor:
    """The picture as the model's input (1, 3, height, width): resized (bicubic), rescaled, normalized."""
    array = np.asarray(picture.convert("RGB").resize(steps.size, Image.Resampling.BICUBIC), dtype=np.float32) * steps.rescale
    if steps.mean is not None:
        array = (array - np.asarray(steps.mean, dtype=np.float32)) / np.asarray(steps.std, dtype=np.float32)
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)


def reading_ranks(order_logits: torch.Tensor) -> torch.Tensor:
    """Each query's rank in reading order from the order head's pairwise logits (transformers'
    _get_order_seqs): a query's votes are the pairs that put it after another."""
    scores = torch.sigmoid(order_logits)
    votes = scores.triu(diagonal=1).sum(dim=1) + (1.0 - scores.transpose(1, 2)).tril(diagonal=-1).sum(dim=1)
    pointers = torch.argsort(votes, dim=1)
    ranks = torch.empty_like(pointers)
    ranks.scatter_(1, pointers, torch.arange(pointers.shape[1], device=pointers.device).expand_as(pointers))
    return ranks


def found_blocks(logits: torch.Tensor, boxes: torch.Tensor, order_logits: torch.Tensor, size: tuple[int, int],
                 labels: dict[int, str], threshold: float) -> list[FoundBlock]:
    """One picture's detections (batch of 1) above `threshold`, in reading order; boxes scaled to
    `size` (width, height)."""
    centers, dims = boxes[0].split(2, dim=-1)
    corners = torch.cat([centers - dims / 2, centers + dims / 2], dim=-1) * torch.tensor([*size, *size], dtype=boxes.dtype)
    classes = logits.shape[-1]
    scores, index = torch.topk(torch.sigmoid(logits[0]).flatten(), logits.shape[1])
    queries = index // classes
    ranks = reading_ranks(order_logits)[0][queries]
    kept = scores >= threshold
    order = torch.argsort(ranks[kept], stable=True)
    picked = [(scores[kept][i], (index[kept][i] % classes), corners[queries[kept][i]]) for i in order.tolist()]
    return [FoundBlock(labels[int(label)], float(score), tuple(float(v) for v in box)) for score, label, box in picked]


class LayoutModel:
    """A PP-DocLayoutV3 (or a model of the same outputs) from a directory."""

    def __init__(self, directory: str | Path, device: str = "cpu", threshold: float = 0.3) -> None:
        from transformers import AutoModelForObjectDetection

        self.directory = Path(directory)
        self.model = AutoModelForObjectDetection.from_pretrained(self.directory).to(device).eval()
        self.steps = pixel_steps(self.directory)
        self.labels = {int(key): value for key, value in self.model.config.id2label.items()}
        self.threshold = threshold
        self.device = device

    @torch.inference_mode()
    def blocks(self, picture: Image.Image) -> list[FoundBlock]:
        outputs = self.model(pixel_values=pixel_values(picture, self.steps).to(self.device))
        return found_blocks(outputs.logits.float().cpu(), outputs.pred_boxes.float().cpu(), outputs.order_logits.float().cpu(),
                            picture.size, self.labels, self.threshold)
