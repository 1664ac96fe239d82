"""How well a replay model reproduces its targets: plain greedy decoding through hsd's decoding
core (as `hsd convert` runs it), character accuracy against the published text."""

from __future__ import annotations

import time
from pathlib import Path

from hsd_cli.decoding import DecodeConfig, decode, decode_many, load_target
from hsd_cli.models.settings import settings_for
from hsd_cli.replay.align import char_accuracy
from hsd_cli.replay.dataset import DATA_DIR, load_examples, load_image

CROP_BATCH = 8


def _budget(target, texts: list[str], ceiling: int) -> int:
    """Room for the longest target twice over: a model that does not stop is cut, not waited for."""
    longest = max((len(target.encode(t)) for t in texts), default=0)
    return min(ceiling, 2 * longest + 32)


def evaluate(model_dir: Path, dtype: str | None = None, device: str = "cpu") -> dict:
    """{"pages", "crops", "page_char_accuracy", "crop_char_accuracy", "exact_pages",
    "seconds_per_page"}; accuracies are means over examples."""
    target = load_target(str(model_dir), device=device, dtype=dtype)
    settings = settings_for(target.model.config.model_type)
    data_dir = model_dir / DATA_DIR
    examples = load_examples(data_dir)
    pages = [e for e in examples if e.kind == "page"]
    crops = [e for e in examples if e.kind == "crop"]
    page_config = DecodeConfig(max_new_tokens=_budget(target, [e.target for e in pages], settings.max_new_tokens))
    page_scores, seconds = [], []
    for example in pages:
        started = time.perf_counter()
        result = decode(target, load_image(data_dir, example), settings.page_prompt, [], page_config)
        seconds.append(time.perf_counter() - started)
        page_scores.append(char_accuracy(result.text.strip(), example.target))
    crop_config = DecodeConfig(max_new_tokens=_budget(target, [e.target for e in crops], settings.max_new_tokens))
    items = [(load_image(data_dir, e), settings.region_prompt, []) for e in crops]
    results = decode_many(target, items, crop_config, batch_size=CROP_BATCH)
    crop_scores = [char_accuracy(r.text.strip(), e.target) for r, e in zip(results, crops, strict=True)]
    return {
        "pages": len(pages),
        "crops": len(crops),
        "page_char_accuracy": round(sum(page_scores) / len(page_scores), 4) if page_scores else None,
        "crop_char_accuracy": round(sum(crop_scores) / len(crop_scores), 4) if crop_scores else None,
        "exact_pages": sum(score == 1.0 for score in page_scores),
        "seconds_per_page": round(sum(seconds) / len(seconds), 3) if seconds else None,
        "dtype": str(target.dtype).removeprefix("torch."),
    }
