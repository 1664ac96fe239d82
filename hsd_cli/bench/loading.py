"""The model a bench reads pages with, loaded as `hsd convert` loads it, or a one-line error."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from hsd_cli.config import ConvertConfig
    from hsd_cli.serving.model import VlmModel


def bench_model_path(model: str) -> str:
    """`model`, or for a replay model's name (`olmocr-replay-qwen2`) its build in the user cache;
    exit 4 with the command that builds it where it is not built."""
    from hsd_cli.replay.presets import ReplayModelNotBuilt, resolve_model

    try:
        return resolve_model(model)
    except ReplayModelNotBuilt as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(4) from None


def bench_model(config: ConvertConfig, threads: int | None) -> VlmModel:
    """The model of `config`, resolved as `hsd convert` resolves it (a replay model with the recipe it was built on) (exit 4 where it, its device or transformers cannot be used; exit 2
    for a family hsd does not serve), with `threads` torch threads and transformers kept quiet."""
    import torch
    from transformers.utils import logging as hf_logging

    from hsd_cli.decoding.hf_target.families import UnsupportedFamilyError
    from hsd_cli.serving.model import VlmModel
    from hsd_cli.serving.resolve import ModelUnavailableError, resolve_model

    if threads:
        torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    from hsd_cli.replay.reader import as_built

    try:
        model = resolve_model(as_built(config))
    except ModelUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(4) from None
    except UnsupportedFamilyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    return VlmModel(model)
