"""The model options resolved once, in the parent, before any worker starts: the model resolves,
the device exists, the installed transformers is one the decoder knows, and every default (device,
dtype, token budget, cost profile) is decided here, so that the workers only read them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hsd_cli.config import ConvertConfig, ModelConfig

if TYPE_CHECKING:
    from hsd_cli.recipes.recipe import Recipe


class RecipeError(ValueError):
    """A recipe that does not exist or does not fit the model (exit code 2)."""


class ModelUnavailableError(RuntimeError):
    """The model, the device or the installed transformers cannot be used; raised before any
    work (exit code 4)."""

    def __init__(self, message: str, hint: str | None = "give a local model directory, or a hub id that is in the HF cache"):
        super().__init__(message)
        self.hint = hint


def _check_device(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailableError(f"--device {device}: no CUDA device is available to this torch", hint=None)
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelUnavailableError("--device mps: MPS is not available", hint=None)


def _family(model: str) -> str:
    from hsd_cli.decoding.hf_target.families import adapter_for
    from hsd_cli.models.family_settings import model_type_of

    try:
        family = model_type_of(model)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelUnavailableError(f"cannot load model {model!r}: {first_line}") from None
    adapter_for(family)  # a family hsd does not serve or refuses raises UnsupportedFamilyError
    return family


def _device_name(device: str) -> str:
    """The device as the loaded model names it (a stored profile's name holds it): cuda is cuda:0."""
    return "cuda:0" if device == "cuda" else device


def _profile(named: str | None, model: str, device: str, dtype: str) -> str | None:
    """The profile named by --profile (it must load), else the one `hsd profile --model` stored for
    this model, device and dtype, else None (`auto` then plans by a fixed rule, trees are whole)."""
    from hsd_cli.profiles import load_profile, profile_name

    if named:
        try:
            load_profile(named)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelUnavailableError(
                f"cannot read cost profile {named!r}: {exc}", hint="make one with `hsd profile --model ...`"
            ) from None
        return named
    stored = profile_name(model, _device_name(device), dtype)
    try:
        load_profile(stored)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stored


def _recipe(named: str | None, model: str, family: str) -> Recipe:
    """The recipe named by --recipe (it must be of the model's family), else the makers' recipe of
    the model's hub id, else the family's default. A makers' recipe whose prompt takes the page's
    text layer (olmOCR-0225's anchor) cannot be read yet: named, it is refused; found by the
    model's id, the family's default stands in."""
    from hsd_cli.models.family_settings import settings_for
    from hsd_cli.recipes.registry import recipe_to_read, recipes

    if named is not None:
        recipe = recipes().get(named)
        if recipe is None:
            raise RecipeError(f"no recipe {named!r}; `hsd models --recipes` lists them")
        if recipe.family != family:
            raise RecipeError(f"recipe {named!r} is for {recipe.family} models, and {model!r} is {family}")
        if recipe.prompt.anchor is not None:
            raise RecipeError(f"recipe {named!r}: a prompt with the page's text layer is not supported yet")
        return recipe
    return recipe_to_read(model, settings_for(family))


def _check_layout_model(directory: str, recipe: Recipe) -> None:
    """A layout model serves a recipe whose makers find a page's blocks with one."""
    two_step = recipe.two_step
    if two_step is None or two_step.layout.finder == "vlm":
        reads = "in one pass" if two_step is None else "its layout itself"
        raise RecipeError(f"--layout-model: recipe {recipe.name!r} reads a page {reads}; a layout model serves PaddleOCR-VL's and GLM-OCR's")
    if two_step.layout.finder != "pp-doclayout-v3":
        raise RecipeError(f"--layout-model: recipe {recipe.name!r} finds blocks with {two_step.layout.finder}; hsd loads PP-DocLayoutV3 only")
    if not (Path(directory) / "config.json").is_file():
        raise RecipeError(f"--layout-model {directory}: no layout model there (no config.json)")


def resolve_model(config: ConvertConfig, reader_wrapper: str | None = None) -> ModelConfig | None:
    """The model options of `config` complete (None where no model reads the pages). Raises
    ModelUnavailableError, UnsupportedFamilyError, RecipeError or SettingsFileError (a family
    settings file that cannot be used) here, once, rather than failing every document in the
    workers."""
    if not config.runs_model:
        return None
    from hsd_cli.decoding import UnsupportedTransformersError, check_cache_layout
    from hsd_cli.decoding.hf_target.devices import default_device, default_dtype
    from hsd_cli.models.family_settings import settings_for

    try:
        check_cache_layout()
    except UnsupportedTransformersError as exc:
        raise ModelUnavailableError(str(exc), hint=None) from None
    if config.device:
        _check_device(config.device)
    family = _family(config.model)
    settings_for(family)  # a family settings file that cannot be used raises SettingsFileError here
    recipe = _recipe(config.recipe, config.model, family)
    if config.near_lossless is not None and recipe.decoding.temperature > 0 and not config.greedy:
        raise RecipeError(f"--near-lossless decodes greedily, and recipe {recipe.name!r} samples: add --greedy")
    if config.layout_model is not None:
        _check_layout_model(config.layout_model, recipe)
    device = config.device or default_device()
    dtype = config.dtype or default_dtype(device)
    model = ModelConfig(
        model=config.model, family=family, device=device, dtype=dtype, trust_remote_code=config.trust_remote_code,
        max_new_tokens=config.max_new_tokens or recipe.decoding.max_new_tokens, baseline=config.baseline, recipe=recipe.name,
        profile=_profile(config.profile, config.model, device, dtype), near_lossless=config.near_lossless,
        greedy=config.greedy, seed=config.seed, layout_model=config.layout_model,
        reader_wrapper=reader_wrapper,
    )
    return replace(model, kv_store_slots=kv_store_slots(model, config))


# Devices whose rows' cache is the in-place KV store (decoding/hf_target/kv_store.py). On CUDA a
# DynamicCache step reads and writes every row's whole cache (about 0.33 GB a row a step for a 7B
# at a page's context: hsd bench kv-traffic), a large share of a step from 8 rows. On the CPU,
# one row by default, the copies are small beside forwards of seconds; even a tiny random
# model's forwards of milliseconds converted the two fixture documents in 9.2-10.9 page-seconds
# with the store against 9.6-12.9 without, within this shared machine's drift (docs/BENCHMARKS.md,
# "KV cache traffic per step"): no gain this machine can tell, so the CPU keeps the default it had.
STORE_DEVICES = ("cuda",)


def kv_store_slots(model: ModelConfig, config: ConvertConfig) -> int | None:
    """Slots a row of the KV store holds on a STORE_DEVICES device: a row's budget (serving.rows:
    an A4 page's prompt at the run's render size, the token budget and the widest tree); None
    elsewhere (transformers' DynamicCache)."""
    if not model.device.startswith(STORE_DEVICES):
        return None
    from hsd_cli.serving.rows import a4_page, row_slots

    return row_slots(model, a4_page(config.dpi, config.max_pixels))
