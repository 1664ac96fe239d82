"""Per-family VLM settings from configs/models/<family>.toml (default.toml for the rest)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"


@dataclass(frozen=True)
class ModelSettings:
    family: str
    description: str
    page_prompt: str
    region_prompt: str
    draft_match: str  # "chars" or "tokens"
    region_padding_px: int
    max_new_tokens: int
    known_ids: tuple[str, ...] = ()


def _read(path: Path) -> ModelSettings:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    known = {f.name for f in fields(ModelSettings)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)} in {path}")
    data["known_ids"] = tuple(data.get("known_ids", ()))
    return ModelSettings(**data)


def all_settings() -> list[ModelSettings]:
    return [_read(path) for path in sorted(CONFIG_DIR.glob("*.toml"))]


def settings_for(model_type: str) -> ModelSettings:
    path = CONFIG_DIR / f"{model_type}.toml"
    return _read(path if path.is_file() else CONFIG_DIR / "default.toml")


def model_type_of(model: str) -> str:
    """The `model_type` of a local model directory or a cached hub id (no download)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model, local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1").model_type


def locate_model(model: str) -> str | None:
    """Where a model is on this machine: a local directory, or the HF cache ($HF_HOME honoured)."""
    path = Path(model)
    if path.is_dir():
        return str(path.resolve()) if (path / "config.json").is_file() else None
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(model, "config.json")
    return str(Path(hit).parent) if isinstance(hit, str) else None
