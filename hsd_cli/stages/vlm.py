"""The VLM that the region and page stages share: options, the checks before any work, and the
model loaded once per worker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from PIL import Image

from hsd_cli.decoding import DecodeConfig, LoadSizer, UnsupportedTransformersError, check_cache_layout, load_target
from hsd_cli.decoding.target.families import adapter_for
from hsd_cli.models.settings import ModelSettings, model_type_of, settings_for
from hsd_cli.profiles import Profile, load_profile, profile_name, square_side


@dataclass(frozen=True)
class VlmOptions:
    model: str
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    max_new_tokens: int | None = None  # None: the family's setting
    baseline: bool = False  # also decode plainly, to measure the speedup
    profile: str | None = None  # the cost profile `--stages auto` plans with (None: the stored one of this model, if any)
    # Does the model read this page? A replay model (a benchmark stand-in) recites only the pages it
    # was built on; `hsd convert` gives its check. None: the model reads any page.
    reads_page: Callable[[Image.Image], bool] | None = None


class ModelUnavailableError(RuntimeError):
    """The model, the device or the installed transformers cannot be used; raised before any
    work (exit code 4)."""

    def __init__(self, message: str, hint: str | None = "give a local model directory, or a hub id that is in the HF cache"):
        super().__init__(message)
        self.hint = hint


def preflight(options: VlmOptions) -> str:
    """Check, without loading weights, that the model resolves, the device exists and the
    installed transformers is one the decoder knows; returns the model family (`model_type`).
    A family hsd does not serve or refuses raises UnsupportedFamilyError, and a family settings
    file that cannot be used SettingsFileError, here, once, rather than failing every document in
    the workers."""
    import torch

    try:
        check_cache_layout()
    except UnsupportedTransformersError as exc:
        raise ModelUnavailableError(str(exc), hint=None) from None

    device = options.device or ""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailableError(f"--device {device}: no CUDA device is available to this torch", hint=None)
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelUnavailableError("--device mps: MPS is not available", hint=None)
    try:
        family = model_type_of(options.model)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelUnavailableError(f"cannot load model {options.model!r}: {first_line}") from None
    adapter_for(family)
    settings_for(family)
    if options.profile:
        try:
            load_profile(options.profile)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelUnavailableError(
                f"cannot read cost profile {options.profile!r}: {exc}", hint="make one with `hsd profile --model ...`"
            ) from None
    return family


def cost_profile(options: VlmOptions, device: str, dtype: str) -> Profile | None:
    """The profile named by --profile, else the one `hsd profile --model` stored for this model,
    device and dtype; None where there is none (`auto` then plans by a fixed rule)."""
    if options.profile:
        return load_profile(options.profile)
    try:
        return load_profile(profile_name(options.model, device, dtype))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class VlmModel:
    """One loaded model, reused for every page a worker converts."""

    @staticmethod
    @cache
    def shared(options: VlmOptions) -> VlmModel:
        """The worker's instance for these options: the model loads once per worker process."""
        return VlmModel(options)

    def __init__(self, options: VlmOptions) -> None:
        self.options = options
        self.target = load_target(
            options.model, device=options.device, dtype=options.dtype, trust_remote_code=options.trust_remote_code
        )
        self.settings: ModelSettings = settings_for(self.target.model_type)
        budget = options.max_new_tokens or self.settings.max_new_tokens
        self.decode_config = DecodeConfig(max_new_tokens=budget)
        self.profile = cost_profile(options, str(self.target.device), str(self.target.dtype).removeprefix("torch."))

    def sizer(self, picture: Image.Image) -> LoadSizer | None:
        """With a cost profile, each step verifies as many draft nodes as the profile prices best
        (decoding/sizing.py), learning acceptance afresh per read so that a page's statistics do not
        depend on the pages read before it; without one, whole trees."""
        if self.profile is None:
            return None
        return LoadSizer(self.profile.step_s, prompt_tokens=self.profile.prefill_tokens(square_side(*picture.size)))

    def outside_replay_set(self, picture: Image.Image) -> bool:
        """A replay model (a benchmark stand-in) recites the pages it was built on: is this not one?"""
        return self.options.reads_page is not None and not self.options.reads_page(picture)
