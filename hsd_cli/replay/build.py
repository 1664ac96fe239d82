"""`hsd replay-model build`: pair pages with outputs, prepare examples, train, save, evaluate,
write the card. Every stage's product lives in the model directory, so `--resume` skips what is
done and continues training from the last checkpoint."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hsd_cli.config import ConvertConfig
from hsd_cli.models.family_settings import settings_for
from hsd_cli.replay.card import model_card
from hsd_cli.replay.dataset import DATA_DIR, Example, ReplayInputError, load_examples, load_image, pair_pages, prepare
from hsd_cli.replay.evaluate import evaluate
from hsd_cli.replay.fingerprint import REPLAY_FILE
from hsd_cli.recipes.registry import recipe_named
from hsd_cli.replay.model import (
    FAMILY,
    ReplayShape,
    TrainedVocabulary,
    build_processor,
    built_recipe,
    full_vocabulary_model,
    load_tokenizer,
    new_model,
    parameter_count,
    recipe_layout,
    save_model_dir,
    train_tokenizer,
)
from hsd_cli.replay.train import (
    CHECKPOINT_FILE,
    Encoded,
    answer_margins,
    checkpoint_opening_end,
    encode_examples,
    load_checkpoint,
    make_batches,
    rate_in_effect,
    train,
)
from hsd_cli.replay.train_config import TrainConfig


@dataclass(frozen=True)
class BuildRequest:
    outputs_dir: Path
    inputs_dir: Path
    model_dir: Path
    name: str
    description: str = "published outputs of an OCR system"
    licence: str = "unspecified: check the source's terms"
    shape: ReplayShape = ReplayShape()
    tokenizer: str | None = None  # a real tokenizer (directory or hub id); None trains one
    train: TrainConfig = TrainConfig()
    resume: bool = False
    evaluate: bool = True
    # The makers' recipe of the model the replay model stands for ("": the family's default):
    # its pages are rendered and answered as that model's, and `hsd convert` reads it that way.
    recipe: str = ""


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(partial, path)


def _started_record(request: BuildRequest, log) -> dict:
    """Pairs pages, prepares the examples and writes the first replay.json (no results yet)."""
    pairs, unmatched = pair_pages(request.outputs_dir, request.inputs_dir)
    for name in unmatched:
        log(f"skipped {name}: no single document for it under {request.inputs_dir}")
    if not pairs:
        raise ReplayInputError(f"no output under {request.outputs_dir} has a document under {request.inputs_dir}")
    settings = settings_for(FAMILY)
    recipe = recipe_named(request.recipe, FAMILY)
    _, prints = prepare(pairs, request.inputs_dir, request.model_dir / DATA_DIR, settings.region_padding_px, recipe, log)
    defaults = ConvertConfig(output_dir=request.model_dir)
    return {
        "format": 1,
        "name": request.name,
        "family": FAMILY,
        "recipe": request.recipe,
        "source": {
            "outputs": str(request.outputs_dir),
            "inputs": str(request.inputs_dir),
            "description": request.description,
            "licence": request.licence,
        },
        "tokenizer": request.tokenizer or f"trained here ({request.shape.vocab_size} tokens)",
        "render": {"dpi": defaults.dpi, "max_pixels": defaults.max_pixels},
        "shape": asdict(request.shape),
        "train_config": asdict(request.train),
        "fingerprints": [asdict(p) for p in prints],
        "build_host": f"{platform.machine()} {os.cpu_count()} CPUs",
    }


def _encoded(processor, model_dir: Path, examples: list[Example]) -> tuple[list[Encoded], TrainedVocabulary]:
    """The examples as the training model sees them, prompted as the recipe it is built on
    prompts: in the dense ids of the vocabulary they use."""
    recipe, data_dir = built_recipe(model_dir), model_dir / DATA_DIR
    prompts = {"page": recipe.prompt.text, "crop": settings_for(FAMILY).region_prompt}
    items = [(load_image(data_dir, e), prompts[e.kind], e.target) for e in examples]
    encoded = encode_examples(processor, items, recipe_layout(recipe))
    tokenizer = processor.tokenizer
    vocabulary = TrainedVocabulary.of(tokenizer, [ids for e in encoded for ids in (e.prompt_ids, e.answer_ids)])
    rows = vocabulary.rows(len(tokenizer))
    dense = [replace(e, prompt_ids=rows[e.prompt_ids], answer_ids=rows[e.answer_ids]) for e in encoded]
    return dense, vocabulary


def shortfall(record: dict) -> str | None:
    """How a finished build falls short of its target, on one line (None: it reached it). The
    target: every example reproduced by greedy decoding (training's "done": each answer token the
    argmax by the done margin), and, where the build evaluated, every page and crop decoded exactly."""
    training = record["training"]
    if training["stop_reason"] != "done":
        return (f"{training['exact_examples']} of {training['examples']} examples reproduced when its "
                f"{training['stop_reason']} budget ran out")
    scores = record.get("eval", {})
    short = [f"{kind} accuracy {scores[key]}" for kind, key in (("page", "page_char_accuracy"), ("crop", "crop_char_accuracy"))
             if scores.get(key) is not None and scores[key] < 1.0]
    return f"greedy decoding reached {' and '.join(short)}" if short else None


def build(request: BuildRequest, log=lambda message: None) -> dict:
    """Build (or with `resume`, continue) a replay model; returns its replay.json record."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    started = time.perf_counter()
    model_dir = request.model_dir
    record_file = model_dir / REPLAY_FILE
    # Time outside training (rendering, drafting, loading, evaluation) of the earlier runs.
    other_seconds = 0.0
    # Loaded first: a tokenizer that is not there fails the build before any page is drafted.
    given_tokenizer = load_tokenizer(request.tokenizer) if request.tokenizer else None
    if request.resume and record_file.is_file():
        record = json.loads(record_file.read_text(encoding="utf-8"))
        other_seconds = record.get("other_seconds", 0.0)
        shape = ReplayShape(**record["shape"])
        record["train_config"] = asdict(request.train)
        log(f"resuming the build in {model_dir}")
    else:
        if model_dir.exists() and any(model_dir.iterdir()) and not request.resume:
            raise ReplayInputError(f"{model_dir} is not empty: give --resume to continue that build, or remove it")
        model_dir.mkdir(parents=True, exist_ok=True)
        record = _started_record(request, log)
        record["other_seconds"] = round(time.perf_counter() - started, 1)  # kept if this run is killed
        shape = request.shape
        _write_json(record_file, record)
    data_dir = model_dir / DATA_DIR
    examples = load_examples(data_dir)
    settings = settings_for(FAMILY)
    if request.resume and (model_dir / "tokenizer.json").is_file():
        from hsd_cli.decoding.hf_target.families import adapter_for

        processor = adapter_for(FAMILY).load_processor(str(model_dir), False)
    else:
        tokenizer = given_tokenizer or train_tokenizer(
            [*(e.target for e in examples if e.kind == "page"), built_recipe(model_dir).prompt.text, settings.region_prompt],
            shape.vocab_size,
        )
        processor = build_processor(shape, tokenizer)
        processor.save_pretrained(model_dir)
    tokenizer = processor.tokenizer
    encoded, vocabulary = _encoded(processor, model_dir, examples)
    model = new_model(shape, tokenizer, request.train.seed, vocabulary)
    log(f"{len(examples)} examples ({sum(e.kind == 'page' for e in examples)} pages), "
        f"{parameter_count(model):,} parameters ({vocabulary.size:,} of {len(tokenizer):,} token ids"
        f"{'' if request.train.train_vision else '; the vision tower fixed'}), "
        f"{sum(x.length for x in encoded):,} tokens per epoch")
    report = train(model, encoded, int(vocabulary.rows(len(tokenizer))[tokenizer.pad_token_id]), request.train,
                   model_dir / CHECKPOINT_FILE, request.resume, log)
    model = full_vocabulary_model(model, shape, tokenizer, vocabulary)
    save_model_dir(model, processor, model_dir)
    record.update(
        parameters=parameter_count(model), vocab_size=len(tokenizer), trained_token_ids=vocabulary.size,
        training=asdict(report),
    )
    if request.evaluate:
        log("evaluating (greedy decoding of every page and crop)")
        record["eval"] = evaluate(model_dir)
    # A killed run's training time counts (the checkpoint has it); its few minutes outside training
    # after the preparation do not.
    record["other_seconds"] = round(other_seconds + time.perf_counter() - started - report.run_seconds, 1)
    record["build_seconds"] = round(report.seconds + record["other_seconds"], 1)
    _write_json(record_file, record)
    (model_dir / "README.md").write_text(model_card(record), encoding="utf-8")
    return record


def build_status(model_dir: Path) -> dict:
    """Where a build stands, from its last checkpoint (a running or stopped build included):
    epochs, training minutes, learning rate, the last epoch's loss, and per example kind how many
    examples greedy decoding would reproduce and how many it would open right (the first answer
    token picks which text follows: a model that cannot tell two images apart fails there),
    teacher-forced (one forward pass each, no decoding)."""
    from hsd_cli.decoding.hf_target.families import adapter_for

    checkpoint = model_dir / CHECKPOINT_FILE
    if not checkpoint.is_file():
        raise ReplayInputError(f"{model_dir}: no checkpoint yet (a build saves one every few minutes of training)")
    record = json.loads((model_dir / REPLAY_FILE).read_text(encoding="utf-8"))
    processor = adapter_for(FAMILY).load_processor(str(model_dir), False)
    examples = load_examples(model_dir / DATA_DIR)
    encoded, vocabulary = _encoded(processor, model_dir, examples)
    state = load_checkpoint(checkpoint)
    config = TrainConfig(**state["train_config"])
    tokenizer = processor.tokenizer
    model = new_model(ReplayShape(**record["shape"]), tokenizer, config.seed, vocabulary)
    model.load_state_dict(state["model"])
    batches = make_batches(encoded, config.batch_tokens)
    pad_id = int(vocabulary.rows(len(tokenizer))[tokenizer.pad_token_id])
    margins = answer_margins(model, encoded, batches, pad_id, config.bf16)
    kinds = {}
    for kind in ("page", "crop"):
        chosen = [m for e, m in zip(examples, margins, strict=True) if e.kind == kind]
        tokens = sum(len(m) for m in chosen)
        kinds[kind] = {
            "examples": len(chosen),
            "reproduced": sum(bool((m > 0).all()) for m in chosen),
            "first_token_right": sum(bool(m[0] > 0) for m in chosen),
            "token_accuracy": round(sum(int((m > 0).sum()) for m in chosen) / tokens, 4) if tokens else None,
        }
    last_epoch = state["losses"][-len(batches):]
    return {
        "name": record["name"],
        "epochs": state["epoch"],
        "steps": state["step"],
        "opening_steps_left": max(0, checkpoint_opening_end(state, config) - state["step"]),
        "training_minutes": round(state["seconds"] / 60, 1),
        "learning_rate": rate_in_effect(config, state["learning_rate"], state["step"], state["seconds"]),
        "loss": round(sum(last_epoch) / len(last_epoch), 4) if last_epoch else None,
        "teacher_forced": kinds,
    }
