"""Replay models: small Qwen2.5-VL models trained to reproduce a real OCR VLM's published
outputs on known pages, so speculative decoding can be measured on realistic model output here.

    hsd replay-model build --outputs DIR --inputs DIR [-o MODEL_DIR | --name NAME]
    hsd replay-model build --preset olmocr-replay-qwen2 --corpus ../shared/corpus   (replay models by name)
    hsd replay-model eval MODEL_DIR|NAME [--converted CONVERT_OUT_DIR] --json
    hsd replay-model status MODEL_DIR|NAME --json

`hsd convert` gives the page stage `replay_pages(model_dir)`, the check of the pages a replay
model was built on, to warn when it is given another page.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hsd_cli.replay.fingerprint import replay_pages
from hsd_cli.replay.train_config import TrainConfig, available_cpus

__all__ = ["replay_app", "replay_pages"]

replay_app = typer.Typer(
    help="Build and evaluate replay models (benchmark stand-ins for real OCR VLMs).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_stderr = Console(stderr=True, highlight=False, soft_wrap=True)  # one message, one line


def _fail(message: str) -> None:
    _stderr.print(f"error: {message}", markup=False)
    raise typer.Exit(2)


def _resolve_model_dir(model: str, finished: bool = True) -> Path:
    """A directory, or the name of a replay model in the user cache (a preset's name included);
    `finished=False` also takes a build that has not saved its model yet."""
    from hsd_cli.replay.presets import PRESETS, build_command_for, default_model_dir

    path = Path(model)
    if not path.is_dir() and not Path(model).parent.parts:
        path = default_model_dir(model)
    if not (path / "replay.json").is_file():
        if model in PRESETS:
            _fail(f"replay model {model} is not built on this machine ({path}): build it with `{build_command_for(model)}`")
        _fail(f"{model}: not a replay model directory (no replay.json)")
    if finished and not (path / "config.json").is_file():
        _fail(f"{model}: the build has not finished (no config.json); `hsd replay-model status {model}` shows where it is")
    return path


@replay_app.command("build")
def build_command(
    outputs: Annotated[
        Path | None, typer.Option("--outputs", help="Published outputs: <stem>_pg<N>_repeat<K>.md or <stem>.md.")
    ] = None,
    inputs: Annotated[Path | None, typer.Option("--inputs", help="The PDFs or page images the outputs were made from.")] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset",
            help="A named replay model (olmocr-replay-qwen2, omnidocbench-replay-qwen2): fills in its name, card, "
            "tokenizer and the fast recipe; its outputs and inputs come from --corpus (or --outputs/--inputs).",
        ),
    ] = None,
    corpus: Annotated[
        Path | None, typer.Option("--corpus", help="With --preset: the evaluation corpus directory (../shared/corpus).")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Model directory (default: $XDG_CACHE_HOME/hsd/replay/NAME).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Model name (default: <outputs dir>-replay).")] = None,
    description: Annotated[str | None, typer.Option("--description", help="What the outputs are, for the model card.")] = None,
    licence: Annotated[
        str | None, typer.Option("--licence", help="Licence of the outputs and documents, for the model card.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of initialisation and batch order.")] = 0,
    minutes: Annotated[
        float | None,
        typer.Option("--minutes", help="Training time limit over all resumed runs (default: none with --steps or a preset, whose steps budget the build; else 120)."),
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Training step limit.")] = None,
    learning_rate: Annotated[
        float | None,
        typer.Option(
            "--learning-rate",
            help=f"Peak learning rate (halved on plateaus, annealed at the end; default {TrainConfig.learning_rate:g}).",
        ),
    ] = None,
    opening_steps: Annotated[
        int | None,
        typer.Option(
            "--opening-steps",
            help="Steps at the start that train only the first answer tokens (how the model tells pages apart; "
            f"0: none; default {TrainConfig.opening_steps}).",
        ),
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the build in the model directory.")] = False,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="CPU threads for training (default: all this process may use; 1 lets two builds share)."),
    ] = None,
    shape: Annotated[str, typer.Option("--shape", help="default (6.3 M parameters) or tiny (tests).")] = "default",
    vocab_size: Annotated[
        int | None, typer.Option("--vocab-size", help="Tokenizer size (default 4096; more for CJK-heavy outputs).")
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="A real Qwen2-family tokenizer (directory or hub id) instead of training one: acceptance in that model's "
            "tokens (a preset's default: tokenizers/qwen2 beside the corpus directory, else the hub's Qwen2.5-VL one).",
        ),
    ] = None,
    max_image_tokens: Annotated[
        int | None,
        typer.Option("--max-image-tokens", help="Image tokens per page at most (default 200; more tells similar pages apart)."),
    ] = None,
    makers_recipe: Annotated[
        str | None,
        typer.Option(
            "--recipe",
            help="The makers' recipe of the model whose outputs these are (`hsd models --recipes`): pages are rendered, "
            "prompted and answered as that model's, and `hsd convert --model` reads the replay model so "
            "(a preset's default: its model's; none: hsd's qwen2_5_vl default).",
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the build record as JSON on stdout.")] = False,
) -> None:
    """Train a replay model on pages and their published outputs (~1-2 h for ~25 pages; a --preset's
    fast recipe takes minutes: docs/BENCHMARKS.md)."""
    from hsd_cli.replay.build import BuildRequest, build, shortfall
    from hsd_cli.replay.dataset import ReplayInputError
    from hsd_cli.replay.model import TINY_SHAPE, ReplayShape
    from hsd_cli.replay.presets import (
        PRESETS,
        default_model_dir,
        preset_paths,
        preset_recipe,
        preset_tokenizer,
    )

    recipe = None
    if preset is not None:
        if preset not in PRESETS:
            _fail(f"--preset {preset}: no such preset; presets: {', '.join(PRESETS)}")
        if corpus is None and (outputs is None or inputs is None):
            _fail(f"--preset {preset} needs --corpus DIR (the evaluation corpus) or both --outputs and --inputs")
        if corpus is not None and not corpus.is_dir():
            _fail(f"--corpus {corpus}: not a directory")
        if vocab_size is not None:
            _fail(f"--preset {preset} is on the Qwen2 tokenizer: --vocab-size sizes a tokenizer the build trains")
        named = PRESETS[preset]
        recipe = preset_recipe(named)
        if corpus is not None:
            corpus_outputs, corpus_inputs = preset_paths(named, corpus)
            outputs, inputs = outputs or corpus_outputs, inputs or corpus_inputs
        name, description, licence = name or named.name, description or named.description, licence or named.licence
        tokenizer = tokenizer or preset_tokenizer(corpus)
        makers_recipe = makers_recipe if makers_recipe is not None else named.makers_recipe
    elif corpus is not None:
        _fail("--corpus goes with --preset; without one give --outputs and --inputs")
    if outputs is None or inputs is None:
        _fail("give --outputs and --inputs (or --preset NAME --corpus DIR)")
    for label, path in (("--outputs", outputs), ("--inputs", inputs)):
        if not path.is_dir():
            _fail(f"{label} {path}: not a directory")
    # Options given win over the preset's recipe, which wins over the defaults.
    steps = steps if steps is not None else recipe.steps if recipe else None
    if minutes is None:
        minutes = recipe.minutes if recipe else None if steps is not None else 120.0
    if learning_rate is None:
        learning_rate = recipe.learning_rate if recipe else TrainConfig.learning_rate
    if opening_steps is None:
        opening_steps = recipe.opening_steps if recipe else TrainConfig.opening_steps
    if shape not in ("default", "tiny"):
        _fail(f"--shape must be default or tiny, got {shape}")
    if (minutes is not None and minutes <= 0) or (steps is not None and steps <= 0) or learning_rate <= 0:
        _fail("--minutes, --steps and --learning-rate must be positive")
    if opening_steps < 0:
        _fail(f"--opening-steps must be 0 or more, got {opening_steps}")
    if steps is not None and opening_steps >= steps:
        _fail(
            f"--opening-steps {opening_steps} leaves none of --steps {steps} for whole examples: "
            "lower it (0 skips the phase)"
        )
    cpus = available_cpus()
    threads = cpus if threads is None else threads
    if not 1 <= threads <= cpus:
        _fail(f"--threads must be between 1 and the {cpus} CPUs this process may use, got {threads}")
    if makers_recipe:
        from hsd_cli.recipes.registry import recipes
        from hsd_cli.replay.model import FAMILY

        found = recipes().get(makers_recipe)
        if found is None or found.family != FAMILY:
            _fail(f"--recipe {makers_recipe}: not a recipe of {FAMILY} models (`hsd models --recipes` lists them)")
    if vocab_size is not None and tokenizer is not None:
        _fail("--vocab-size sizes the tokenizer a build trains; with --tokenizer there is none to train")
    if vocab_size is not None and not 512 <= vocab_size <= 65536:
        _fail(f"--vocab-size must be between 512 and 65536, got {vocab_size}")
    if max_image_tokens is not None and not 16 <= max_image_tokens <= 4096:
        _fail(f"--max-image-tokens must be between 16 and 4096, got {max_image_tokens}")
    chosen = TINY_SHAPE if shape == "tiny" else recipe.shape if recipe else ReplayShape()
    if vocab_size is not None:
        chosen = replace(chosen, vocab_size=vocab_size)
    if max_image_tokens is not None:
        chosen = replace(chosen, max_image_tokens=max_image_tokens)
    name = name or f"{outputs.resolve().name}-replay"
    model_dir = output or default_model_dir(name)
    train = TrainConfig(
        seed=seed, learning_rate=learning_rate, opening_steps=opening_steps, max_minutes=minutes, max_steps=steps,
        threads=threads, **(recipe.train_settings if recipe else {}),
    )
    request = BuildRequest(
        outputs_dir=outputs.resolve(), inputs_dir=inputs.resolve(), model_dir=model_dir, name=name,
        description=description or BuildRequest.description, licence=licence or BuildRequest.licence, shape=chosen,
        tokenizer=tokenizer, train=train, resume=resume, recipe=makers_recipe or "",
    )
    _stderr.print(f"building replay model {name} in {model_dir}", markup=False)
    try:
        record = build(request, log=lambda message: _stderr.print(message, markup=False))
    except (ReplayInputError, ValueError) as exc:
        _fail(str(exc))
    scores = record.get("eval", {})
    _stderr.print(
        f"done, whole build {record['build_seconds'] / 60:.1f} min: page accuracy {scores.get('page_char_accuracy')}, "
        f"crop accuracy {scores.get('crop_char_accuracy')}; card: {model_dir / 'README.md'}", markup=False,
    )
    if json_output:
        summary = {k: record[k] for k in ("name", "parameters", "training", "build_seconds", "eval") if k in record}
        sys.stdout.write(json.dumps({"model_dir": str(model_dir), **summary, "short": shortfall(record)}) + "\n")
    short = shortfall(record)
    if short is not None:
        # Exit 1 (the run finished, its product failed): a script must not bench a model that
        # cannot reproduce its pages.
        _stderr.print(f"error: replay model {name} ended short of its target: {short}; "
                      f"give --resume and a larger --steps to train on", markup=False)
        raise typer.Exit(1)


@replay_app.command("eval")
def eval_command(
    model: Annotated[str, typer.Argument(help="Replay model directory or name in the user cache.")],
    dtype: Annotated[str | None, typer.Option("--dtype", help="float32 or bfloat16 (default: as hsd convert).")] = None,
    converted: Annotated[
        Path | None,
        typer.Option("--converted", help="Score an `hsd convert --model` output directory instead of decoding."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the scores as JSON on stdout.")] = False,
) -> None:
    """Greedy-decode every page and crop of a replay model and score it against the targets; with
    --converted, score the pages of a convert run against them instead."""
    from hsd_cli.replay.evaluate import evaluate, evaluate_converted

    if dtype not in (None, "float32", "bfloat16"):
        _fail(f"--dtype must be float32 or bfloat16, got {dtype}")
    model_dir = _resolve_model_dir(model)
    if converted is not None:
        if dtype is not None:
            _fail("--dtype is for decoding; --converted scores what a convert run already decoded")
        if not converted.is_dir():
            _fail(f"--converted {converted}: not a directory")
        scores = evaluate_converted(model_dir, converted)
        if not scores["pages"]:
            _fail(f"--converted {converted}: none of the model's {len(scores['missing'])} pages is in an hsd JSON there")
    else:
        scores = evaluate(model_dir, dtype=dtype)
    if json_output:
        sys.stdout.write(json.dumps(scores) + "\n")
    else:
        for key, value in scores.items():
            _stderr.print(f"{key}: {value}", markup=False)


@replay_app.command("status")
def status_command(
    model: Annotated[str, typer.Argument(help="Replay model directory or name in the user cache (finished or not).")],
    json_output: Annotated[bool, typer.Option("--json", help="Print the status as JSON on stdout.")] = False,
) -> None:
    """Where a build stands, from its last checkpoint: epochs, minutes, loss, and how many pages and
    crops greedy decoding would reproduce and start right (teacher-forced; no decoding, so it is
    quick)."""
    from hsd_cli.replay.build import build_status
    from hsd_cli.replay.dataset import ReplayInputError

    try:
        status = build_status(_resolve_model_dir(model, finished=False))
    except ReplayInputError as exc:
        _fail(str(exc))
    if json_output:
        sys.stdout.write(json.dumps(status) + "\n")
        return
    if status["opening_steps_left"]:
        _stderr.print(f"{status['name']}: openings phase, {status['opening_steps_left']} steps left", markup=False)
    _stderr.print(
        f"{status['name']}: epoch {status['epochs']}, {status['training_minutes']} min trained, "
        f"learning rate {status['learning_rate']:.2e}, loss {status['loss']}", markup=False,
    )
    for kind, figures in status["teacher_forced"].items():
        _stderr.print(
            f"  {kind}s: {figures['reproduced']}/{figures['examples']} reproduced, "
            f"{figures['first_token_right']} with the right first token, "
            f"token accuracy {figures['token_accuracy']} (teacher-forced)", markup=False,
        )
