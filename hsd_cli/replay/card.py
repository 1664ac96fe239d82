"""The model card (README.md) written into every replay model directory."""

from __future__ import annotations


def _figure(value, digits: int = 4) -> str:
    return "not measured" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def model_card(record: dict) -> str:
    """Markdown from the replay.json record of a finished build."""
    source, training, scores = record["source"], record["training"], record.get("eval") or {}
    pages = "\n".join(f"- `{p['source']}` page {p['page_no']}" for p in record["fingerprints"])
    shape = record["shape"]
    threads = record["train_config"]["threads"]
    tokenizer = record.get("tokenizer", "own byte-level BPE")
    # The fast recipe keeps the tower at its seeded initialisation (train_vision False).
    tower = "" if record["train_config"].get("train_vision", True) else ", kept at its seeded initialisation (not trained)"
    return f"""# {record['name']}: a replay model (benchmark stand-in)

**This model cannot read.** It is a {record['parameters'] / 1e6:.1f} M-parameter Qwen2.5-VL that hsd
trained to reproduce, page by page, the published outputs of another OCR system on
{len(record['fingerprints'])} known pages. On those pages its greedy output follows the real system's
output, so speculative-decoding acceptance and speed measured on it are realistic; on any other page
its output is meaningless, and hsd warns on stderr when it is given one.

## What it replays
- Outputs: `{source['outputs']}` ({source['description']})
- Page images: `{source['inputs']}`, rendered as `hsd convert` renders them (dpi {record['render']['dpi']},
  at most {record['render']['max_pixels']} pixels), then resized by the processor to at most
  {shape['max_image_tokens']} image tokens.
- Licence of the replayed outputs and documents: {source['licence']}. This model is derived from them;
  use it under the same terms, for benchmarking only.
- Region crops: each layout block of hsd's draft stage, with the part of the published page output that
  aligns with the block's draft text (empty when none does, so hsd keeps the pipeline draft).

## Pages
{pages}

## Size and build
- Architecture: Qwen2.5-VL, text {shape['text_layers']} layers x {shape['text_width']} wide, vision
  {shape['vision_depth']} blocks x {shape['vision_width']} wide{tower}; tokenizer: {tokenizer} ({record['vocab_size']:,} ids,
  {record.get('trained_token_ids', record['vocab_size']):,} of them trained, every other id sharing one row that stays
  below every answer token) with Qwen's chat and vision special tokens.
- Parameters: {record['parameters']:,}
- Training: {training['steps']} steps, {training['epochs']} epochs, {training['seconds'] / 60:.1f} min over all runs
  on {record['build_host']} ({threads} thread{'s' if threads > 1 else ''} in the last run), seed {record['train_config']['seed']};
  ended by: {training['stop_reason']}; teacher-forced exact on {training['exact_examples']} of {training['examples']} examples.
- Whole build: {record['build_seconds'] / 60:.1f} min (training, plus {record['other_seconds'] / 60:.1f} min of rendering,
  drafting, loading and evaluation).

## Measured accuracy (greedy, {scores.get('dtype', 'n/a')}; 1 - normalised edit distance)
| pages | page char accuracy | exact pages | crops | crop char accuracy | seconds per page |
|---|---|---|---|---|---|
| {scores.get('pages', 'n/a')} | {_figure(scores.get('page_char_accuracy'))} | {scores.get('exact_pages', 'n/a')} | {scores.get('crops', 'n/a')} | {_figure(scores.get('crop_char_accuracy'))} | {_figure(scores.get('seconds_per_page'), 2)} |

Re-measure with `hsd replay-model eval <this directory> --json`.
"""
