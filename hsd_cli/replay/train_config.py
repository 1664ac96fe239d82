"""How a replay model is trained: apart from train.py so that the CLI reads its defaults without
importing torch."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _cpu_computes_bf16() -> bool:
    from hsd_cli.decoding.hf_target.devices import cpu_computes_bf16

    return cpu_computes_bf16()


def available_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    # 5e-4 with 3000 opening steps: the recipe both corpus builds needed (at 2e-3 without openings
    # their crops kept starting with other crops' text; docs/BENCHMARKS.md).
    learning_rate: float = 5e-4
    warmup_steps: int = 20
    first_tokens: int = 8  # answer tokens whose mean loss is added once more, in head batches
    first_weight: float = 1.0  # of the head batches' loss; 0: no head batches
    # The first answer tokens' mean loss added with this weight inside every whole-example batch:
    # the head batches' emphasis without their second pass over the prompts.
    body_first_weight: float = 0.0
    # Steps at the start that train on head batches only (no full examples, no epochs counted).
    opening_steps: int = 3000
    # A minute-limited build ends its openings at this share of its minutes if their steps are not
    # done by then: the whole examples need the rest (the corpus builds finished theirs at 37 %).
    opening_share: float = 0.5
    # False: the vision tower keeps its initialisation and its features are computed once.
    train_vision: bool = True
    batch_tokens: int = 4096  # padded tokens per batch (examples of similar length go together)
    head_batch_tokens: int = 2048
    # Halve the learning rate when the epoch loss has not set a new best for this many epochs.
    patience: int = 6
    min_learning_rate: float = 3e-5
    # The last part of the budget (steps if limited, else minutes) anneals the rate linearly to
    # min_learning_rate: a noisy loss that keeps setting new bests never trips the plateau rule,
    # and exact recall needs small steps at the end. A resume with a larger budget moves the phase.
    anneal_fraction: float = 0.3
    # Training time over all resumed runs; None: none (a step budget trains the same model however
    # loaded the machine is, where a minute budget stopped a build short on a shared one).
    max_minutes: float | None = 120.0
    max_steps: int | None = None
    checkpoint_minutes: float = 5.0
    # Done when every answer token is the argmax by at least this logit margin: greedy decoding
    # then reproduces the targets, also in bfloat16 where logits move by a few hundredths (both
    # corpus builds decoded exactly in bf16 at smallest margins of 0.12-0.19).
    done_margin: float = 0.1
    check_below_loss: float = 0.05  # run the (forward-only) completion check once the loss is this low
    # Autocast: the matmuls of a model this small are faster in bf16 on a CPU that computes bf16
    # natively, and many times slower on one that does not.
    bf16: bool = field(default_factory=_cpu_computes_bf16)
    # All the CPUs by default: the corpus builds reached their accuracy within two hours on two
    # threads, whose steps take half the time of one thread's. The bf16 sums depend on the count,
    # so a build is deterministic for a seed and thread count; one thread lets two builds share.
    threads: int = field(default_factory=available_cpus)
