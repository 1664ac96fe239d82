"""What an eager forward costs the host that issues it: the Python and ATen dispatch of every
module and op (measured here, on a model of the architecture's own layers at tiny widths, where
the ops' arithmetic is negligible) and one CUDA launch per op that runs a kernel (counted).

On a GPU this work overlaps the device's: the host issues kernels ahead while the device runs
them, so an eager forward takes the longer of the two (`Profile.step_s`). A plain engine that
replays CUDA graphs issues none of it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from time import thread_time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hsd_cli.decoding.layer_mix import layer_kinds

# The host's cost of one kernel launch (cudaLaunchKernel and the caching allocator's bookkeeping)
# beyond ATen's dispatch, which the measurement holds: a few microseconds on current drivers.
KERNEL_LAUNCH_S = 2.5e-6
# The step measured: a verification forward of 8 rows of 4-node chains after a short prompt (the
# issue time hardly depends on the shape: the same ops run over larger tensors).
ISSUE_ROWS, ISSUE_NODES, ISSUE_PROMPT_TOKENS = 8, 4, 64


@dataclass(frozen=True)
class IssueCost:
    """The host's work to issue one eager forward of a model."""

    dispatch_s: float  # Python and ATen dispatch, thread CPU time of this machine
    kernels: int  # ops that run a kernel (views excluded)

    @property
    def seconds(self) -> float:
        return self.dispatch_s + self.kernels * KERNEL_LAUNCH_S


def measure_issue(config: dict[str, Any], dtype: str = "bfloat16", repeats: int = 15) -> IssueCost:
    """The issue cost of a forward of `config`'s architecture: its family's tiny random model with
    the config's layers (kinds and count) at tiny widths on this CPU, one thread. Dispatch is
    timed in float32 (the fastest of `repeats` forwards' thread CPU time: other work on the machine
    slows a thread through its shared caches, not only by taking turns), where a tiny op's
    arithmetic is negligible (this CPU emulates bfloat16's); kernels are counted in `dtype`,
    whose casts run kernels that float32's skip."""
    from hsd_cli.decoding import load_target
    from hsd_cli.models.tiny_families import RECIPES, build_tiny_random

    family = config.get("model_type", "")
    if family not in RECIPES:
        raise ValueError(f"no tiny recipe for {family!r} to measure its forward's issue time")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as model_dir:
            build_tiny_random(family, model_dir, layers=layer_kinds(config.get("text_config") or config))
            timed = _verification_forward(load_target(model_dir, device="cpu", dtype="float32"))
            dispatch_s = min(timed() for _ in range(repeats))
            counted_forward, counted = _verification_forward(load_target(model_dir, device="cpu", dtype=dtype)), KernelCount()
            counted_forward(counted)
            return IssueCost(dispatch_s, counted.kernels)
    finally:
        torch.set_num_threads(threads)


class KernelCount(TorchDispatchMode):
    """Counts the ATen ops that run a kernel (a view runs none)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


def _verification_forward(target: Any) -> Callable[..., float]:
    """A verification forward (ISSUE_ROWS rows of ISSUE_NODES-node chains after a short prompt)
    that returns its thread CPU seconds, under `mode` if given, and puts the cache back after."""
    from hsd_cli.decoding.tree import TokenTree, batch_trees
    from hsd_cli.profiles.measured import text_prompt

    prompt = text_prompt(target, ISSUE_PROMPT_TOKENS)
    state, _ = target.prefill(target.inputs([None] * ISSUE_ROWS, [prompt] * ISSUE_ROWS))
    token = int(target.encode(" page")[0])
    trees = batch_trees([TokenTree.chain(token, [token] * (ISSUE_NODES - 1))] * ISSUE_ROWS)

    def forward(mode: TorchDispatchMode | None = None) -> float:
        started = thread_time()
        with mode or contextlib.nullcontext():
            target.forward_tree(state, trees.tokens, trees.depths, trees.ancestors, trees.valid)
        elapsed = thread_time() - started
        target.commit(state, trees.width, [[]] * ISSUE_ROWS)  # nothing kept: the next forward meets the same cache
        return elapsed

    return forward
