"""How well a replay model reproduces its targets: plain greedy decoding through hsd's decoding
core (as `hsd convert` runs it, prompted as the recipe the model is built on), character accuracy
against the published text (as that recipe's model answers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hsd_cli.decoding import DecodeConfig, decode, decode_many, load_target
from hsd_cli.models.family_settings import settings_for
from hsd_cli.replay.align import char_accuracy
from hsd_cli.replay.dataset import DATA_DIR, load_examples, load_image
from hsd_cli.recipes.postprocess import POSTPROCESSORS
from hsd_cli.replay.model import built_recipe, recipe_layout
from hsd_cli.stages.region import REGION_BATCH


def _budget(target, texts: list[str], ceiling: int) -> int:
    """Room for the longest target twice over: a model that does not stop is cut, not waited for."""
    longest = max((len(target.encode(t)) for t in texts), default=0)
    return min(ceiling, 2 * longest + 32)


def evaluate(model_dir: Path, dtype: str | None = None, device: str = "cpu") -> dict:
    """{"pages", "crops", "page_char_accuracy", "crop_char_accuracy", "exact_pages",
    "seconds_per_page"}; accuracies are means over examples."""
    recipe = built_recipe(model_dir)
    target = load_target(str(model_dir), device=device, dtype=dtype, layout=recipe_layout(recipe))
    settings = settings_for(target.model_type)
    data_dir = model_dir / DATA_DIR
    examples = load_examples(data_dir)
    pages = [e for e in examples if e.kind == "page"]
    crops = [e for e in examples if e.kind == "crop"]
    page_config = DecodeConfig(max_new_tokens=_budget(target, [e.target for e in pages], settings.max_new_tokens))
    page_scores, seconds = [], []
    for example in pages:
        started = time.perf_counter()
        result = decode(target, load_image(data_dir, example), recipe.prompt.text, [], page_config)
        seconds.append(time.perf_counter() - started)
        page_scores.append(char_accuracy(result.text.strip(), example.target))
    crop_config = DecodeConfig(max_new_tokens=_budget(target, [e.target for e in crops], settings.max_new_tokens))
    items = [(load_image(data_dir, e), settings.region_prompt, []) for e in crops]
    results = decode_many(target, items, crop_config, batch_size=REGION_BATCH)  # as the region stage batches them
    crop_scores = [char_accuracy(r.text.strip(), e.target) for r, e in zip(results, crops, strict=True)]
    return {
        "pages": len(pages),
        "crops": len(crops),
        "page_char_accuracy": _mean(page_scores),
        "crop_char_accuracy": _mean(crop_scores),
        "exact_pages": sum(score == 1.0 for score in page_scores),
        "seconds_per_page": round(sum(seconds) / len(seconds), 3) if seconds else None,
        "dtype": str(target.dtype).removeprefix("torch."),
    }


def _converted_pages(out_dir: Path) -> dict[tuple[str, int], dict]:
    """(source path as converted, page number) -> page record, from every hsd JSON under out_dir."""
    pages = {}
    for path in sorted(out_dir.rglob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(document, dict) or document.get("schema") != "hsd.document":
            continue
        for page in document["pages"]:
            pages[(Path(document["source"]["path"]).as_posix(), page["page"])] = page
    return pages


def evaluate_converted(model_dir: Path, out_dir: Path) -> dict:
    """How closely an `hsd convert --model <this replay model>` run reproduced the published
    outputs: each replay page is looked up in the hsd JSON under `out_dir` by its document's path
    relative to the build's inputs (any converted root) and page number.
    {"pages", "missing", "page_char_accuracy", "exact_pages", "model_pages",
    "model_page_char_accuracy", "model_exact_pages"}: the first scores are of what hsd wrote;
    model_pages counts pages whose text came from the model (the others fell back to the draft or
    ran without it), and the model_ scores are of the model's own page output wherever it ran,
    used or not (a published empty page is reproduced by an empty output, which hsd replaces
    with the draft)."""
    converted = _converted_pages(out_dir)
    postprocess = POSTPROCESSORS[built_recipe(model_dir).output.postprocess]
    scores, model_scores, model_pages, missing = [], [], 0, []
    for example in load_examples(model_dir / DATA_DIR):
        if example.kind != "page":
            continue
        published = postprocess(example.target, 0).text or ""  # the answer's text, as the page keeps it
        found = [page for (path, page_no), page in converted.items()
                 if page_no == example.page_no and (path == example.source or path.endswith("/" + example.source))]
        if len(found) != 1:
            missing.append(f"{example.source} page {example.page_no}")
            continue
        page = found[0]
        scores.append(char_accuracy(page["markdown"].strip(), published))
        from_model = page.get("text_source") == "model"
        model_pages += from_model
        if from_model:
            model_scores.append(char_accuracy(page["markdown"].strip(), published))
    return {
        "pages": len(scores),
        "missing": missing,
        "page_char_accuracy": _mean(scores),
        "exact_pages": sum(score == 1.0 for score in scores),
        "model_pages": model_pages,
        "model_page_char_accuracy": _mean(model_scores),
        "model_exact_pages": sum(score == 1.0 for score in model_scores),
    }


def _mean(scores: list[float]) -> float | None:
    return round(sum(scores) / len(scores), 4) if scores else None
