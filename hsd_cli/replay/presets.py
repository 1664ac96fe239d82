"""Replay models by name: what the benches use, built by one command with the fast recipe.

    hsd replay-model build --preset olmocr-replay-qwen2 --corpus ../shared/corpus

A preset fills in the outputs and inputs (under the corpus directory), the model card's
description and licence, the tokenizer and the recipe; `--model NAME` (convert, bench,
replay-model eval/status) then finds the model in the user cache, or says how to build it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

# The real Qwen2/2.5 tokenizer: the shared copy beside the corpus when there is one, else the
# hub id (from the HF cache or the network).
SHARED_TOKENIZER = Path("tokenizers") / "qwen2"  # relative to the corpus directory's parent
QWEN2_TOKENIZER_HUB_ID = "Qwen/Qwen2.5-VL-7B-Instruct"


@dataclass(frozen=True)
class ReplayPreset:
    name: str
    outputs: str  # published outputs, relative to the corpus directory
    inputs: str  # their documents, relative to the corpus directory
    description: str
    licence: str
    # The recipe's step budget where this preset's examples need another (None: the recipe's).
    steps: int | None = None
    # The makers' recipe of the model whose outputs these are (hsd_cli.recipes; "": hsd's default).
    makers_recipe: str = ""


PRESETS = {
    preset.name: preset
    for preset in (
        ReplayPreset(
            name="olmocr-replay-qwen2",
            outputs="olmocr_bench_sample/example_outputs_NOT_GT/olmocr_pipeline",
            inputs="olmocr_bench_sample/pdfs",
            description=(
                "olmOCR pipeline outputs shipped with olmOCR-Bench (allenai/olmocr olmocr/bench/sample_data "
                "@ f7cfe4c2), 23 pages, on the Qwen2 tokenizer"
            ),
            licence="Apache-2.0 (allenai/olmocr repository); olmOCR-Bench data ODC-BY; documents are third-party",
            # Its longest page (a 2,530-token table) stayed 2 of 222 examples short at 5,000 steps
            # (and 6,000 resumed, and with a third layer): the budget anneals the rate over its last
            # 30 %, too early. At 9,000 the build reproduced all 222 by itself after 5,250 steps
            # (docs/BENCHMARKS.md).
            steps=9000,
            makers_recipe="olmocr-2",
        ),
        ReplayPreset(
            name="omnidocbench-replay-qwen2",
            outputs="omnidocbench_demo/example_predictions_NOT_GT",
            inputs="omnidocbench_demo/images",
            description=(
                "OmniDocBench example predictions (pichiu/OmniDocBench demo_data/end2end @ 7bd6c2eb), 13 pages, "
                "on the Qwen2 tokenizer"
            ),
            licence="OmniDocBench data: research purposes only, not for commercial use; repository code Apache-2.0",
            # 5,000 steps met its bar on one machine (AMD EPYC) and left 1 of 144 examples short on
            # another (Intel Xeon: page accuracy 0.9686): the same late annealing as above.
            steps=9000,
        ),
    )
}


def default_model_dir(name: str) -> Path:
    """Replay models are built into the user cache, never into the repository."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "hsd" / "replay" / name


@dataclass(frozen=True)
class Recipe:
    """The fast recipe (docs/BENCHMARKS.md, "Replay model builds"): what a preset build trains
    with unless an option says otherwise."""

    steps: int
    minutes: float | None  # None: the steps alone budget the build
    learning_rate: float
    opening_steps: int
    shape_settings: dict = field(default_factory=dict)  # ReplayShape fields
    train_settings: dict = field(default_factory=dict)  # further TrainConfig fields

    @property
    def shape(self):
        from hsd_cli.replay.model import ReplayShape

        return ReplayShape(**self.shape_settings)


FAST_RECIPE = Recipe(
    steps=5000,  # the schedule (rate, annealing) hangs off steps, so a busy machine trains the same model
    # No minutes: a build stopped by the clock on a loaded machine ended short of its pages (141 of
    # 144) and the steps decide what is trained anyway; `--minutes` still adds a stop.
    minutes=None,
    learning_rate=3e-3,
    opening_steps=1000,
    shape_settings={"text_layers": 2, "text_width": 128, "text_heads": 2, "text_kv_heads": 1, "text_ffn": 384},
    train_settings={
        "train_vision": False,
        "batch_tokens": 1024,
        "head_batch_tokens": 1024,
        "first_weight": 0.0,
        "body_first_weight": 1.0,
    },
)


class ReplayModelNotBuilt(LookupError):
    """A preset named as a model whose build is not in the user cache."""


def preset_recipe(preset: ReplayPreset) -> Recipe:
    return FAST_RECIPE if preset.steps is None else replace(FAST_RECIPE, steps=preset.steps)


def build_command_for(name: str) -> str:
    return f"hsd replay-model build --preset {name} --corpus ../shared/corpus"


def preset_tokenizer(corpus: Path | None) -> str:
    shared = corpus.resolve().parent / SHARED_TOKENIZER if corpus is not None else None
    return str(shared) if shared is not None and (shared / "tokenizer.json").is_file() else QWEN2_TOKENIZER_HUB_ID


def preset_paths(preset: ReplayPreset, corpus: Path) -> tuple[Path, Path]:
    """(outputs, inputs) of a preset under a corpus directory."""
    return corpus / preset.outputs, corpus / preset.inputs


def resolve_model(model: str) -> str:
    """`model` unchanged, unless it is a preset's name and no directory of that name is here: then
    the finished build in the user cache. Raises ReplayModelNotBuilt (a one-line message with the
    build command) when that build is missing or unfinished."""
    if model not in PRESETS or Path(model).is_dir():
        return model
    model_dir = default_model_dir(model)
    if not (model_dir / "config.json").is_file():
        state = "has not finished" if model_dir.is_dir() else "is not built on this machine"
        raise ReplayModelNotBuilt(
            f"replay model {model} {state} ({model_dir}): build it with `{build_command_for(model)}`"
            f"{' --resume' if model_dir.is_dir() else ''}"
        )
    return str(model_dir)
