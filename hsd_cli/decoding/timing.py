"""Timing device work: CUDA and MPS run asynchronously, so a clock read right after a call would
stop when the work was queued, not when it was done."""

from __future__ import annotations

import torch


def wait_for(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` once its device has computed it. Costs nothing in a step: verification reads the
    logits back right after anyway."""
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
    elif tensor.device.type == "mps":
        torch.mps.synchronize()
    return tensor
