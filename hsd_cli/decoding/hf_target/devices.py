"""Where and in what precision a model runs when the user does not say."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX). Without it torch falls back
    to a reference kernel: bf16 matmuls measured 4 to 20 times slower than fp32 on an AMD EPYC
    without AVX512, while on a CPU with AVX512-BF16 they were up to 2 times faster."""
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def default_dtype(device: str) -> str:
    if device == "mps":
        return "float16"
    if device == "cpu" and not cpu_computes_bf16():
        return "float32"
    return "bfloat16"
