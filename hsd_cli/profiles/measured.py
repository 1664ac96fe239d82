"""A profile measured on this device: tree forwards over a grid of batch rows x tree nodes x
context, picture prefills by size, and the host work of the decoding loop's steps."""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

import numpy as np

from hsd_cli.profiles import ForwardCost, HostCost, PrefillCost, Profile, profile_name

ROWS = (1, 2, 4, 8, 16, 32, 64)
NODES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (512, 2048)
# 150 dpi renders a Letter page about 1,650 px high; hsd convert's --max-pixels keeps a page under 2,048^2.
IMAGE_SIDES = (224, 448, 896, 1344, 1792, 2240)
MAX_TOKENS = 4096  # rows x nodes of the largest forward measured (64 x 64: the whole default grid)
HOST_ROWS = (1, 8, 64)
HOST_TOKENS = 48  # tokens each host run decodes


def text_prompt(target: Any, tokens: int) -> str:
    """A text prompt of about `tokens` tokens in the target's chat template."""
    unit = " page"
    per_unit = max(1, len(target.encode(unit * 100)) / 100)
    return (unit * int(tokens / per_unit)).strip()


def _best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def measure_forwards(
    target: Any, rows: tuple[int, ...], nodes: tuple[int, ...], contexts: tuple[int, ...], max_tokens: int, repeats: int,
    progress: Callable[[str], None],
) -> tuple[ForwardCost, ...]:
    """Tree forwards (a chain of `nodes` per row after a cache of `context` entries; the forward's
    entries are dropped again after each), fastest of `repeats`, up to `max_tokens` a forward."""
    import torch

    from hsd_cli.decoding.timing import wait_for

    forwards = []
    for context in contexts:
        # One row is prefilled; more rows are copies of it (prefilling 8 rows of a real size
        # costs minutes on a CPU, and a forward's cost does not depend on what the rows hold).
        state, _ = target.prefill(target.inputs([None], [text_prompt(target, context)]))
        cached = int(state.past_len[0])
        for batch in sorted(rows):
            widths = [width for width in sorted(nodes) if batch * width <= max_tokens]
            if not widths:
                break
            target.keep_rows(state, [0] * batch)
            for width in widths:
                tokens = torch.full((batch, width), int(target.encode(" page")[0]), dtype=torch.long)
                depths = torch.arange(width).expand(batch, -1)
                chain = torch.tril(torch.ones(width, width, dtype=torch.bool)).expand(batch, -1, -1)

                def forward() -> float:
                    started = perf_counter()
                    wait_for(target.forward_tree(state, tokens, depths, chain))
                    seconds = perf_counter() - started
                    target.commit(state, width, [[] for _ in range(batch)])  # back to `cached` entries
                    return seconds

                forward()  # warm-up: first use of a shape
                forwards.append(ForwardCost(batch, width, cached, _best_of(repeats, forward)))
                progress(f"forward rows {batch} nodes {width} context {cached}: {forwards[-1].seconds:.4f} s")
    return tuple(forwards)


def measure_prefills(target: Any, image_sides: tuple[int, ...], repeats: int, progress: Callable[[str], None]) -> tuple[PrefillCost, ...]:
    """One-row prefills of square noise pictures, the processor's work on the picture included
    (as the decoding loop's prefill), fastest of `repeats`."""
    from PIL import Image

    from hsd_cli.decoding.timing import wait_for

    prefills = []
    rng = np.random.default_rng(0)
    for side in image_sides:
        picture = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
        tokens = int(target.inputs([picture], ["Read this page."])["input_ids"].shape[1])

        def prefill() -> float:
            started = perf_counter()
            wait_for(target.prefill(target.inputs([picture], ["Read this page."]))[1])
            return perf_counter() - started

        prefills.append(PrefillCost(side, tokens, _best_of(repeats, prefill)))
        progress(f"prefill {side}x{side} ({tokens} tokens): {prefills[-1].seconds:.3f} s")
    return tuple(prefills)


def fit_host(runs: list[tuple[int, float, float]]) -> HostCost:
    """HostCost from runs of (rows, mean nodes per row, host seconds per step): least squares,
    a coefficient that would come out negative left at 0 (noise, not a gain)."""
    design = np.array([[1.0, rows, rows * nodes] for rows, nodes, _ in runs])
    seconds = np.array([seconds_a_step for _, _, seconds_a_step in runs])
    kept = [0, 1, 2]
    while True:
        solved = np.linalg.lstsq(design[:, kept], seconds, rcond=None)[0]
        if (solved >= 0).all() or len(kept) == 1:
            break
        kept = [column for column, value in zip(kept, solved) if value > 0] or kept[:1]
    coefficients = dict(zip(kept, solved.clip(min=0.0)))
    return HostCost(*(float(coefficients.get(column, 0.0)) for column in range(3)))


def measure_host(
    target: Any, context: int, rows: tuple[int, ...], repeats: int, progress: Callable[[str], None],
) -> HostCost:
    """The decoding loop's host seconds per step (DecodeStats.host_s: everything but the forward)
    over HOST_TOKENS tokens of `rows` copies of one text prompt of about `context` tokens, without
    drafts and with drafts made of the plain output less every 8th token (chains that hold for a
    while, then tries where they break); fastest of `repeats` per run; fitted by `fit_host`."""
    from hsd_cli.decoding import DecodeConfig, DecodeRequest, decode_batch, make_proposer

    prompt = text_prompt(target, context)
    config = DecodeConfig(max_new_tokens=HOST_TOKENS, stop_token_ids=())  # every run decodes its budget

    def decoded(batch: int, drafts: list[str]) -> Any:
        requests = [DecodeRequest(None, prompt, make_proposer(target, drafts)) for _ in range(batch)]
        return decode_batch(target, requests, config)[0]

    plain = decoded(1, []).tokens
    drafts = [target.decode([token for index, token in enumerate(plain) if index % 8 != 7])]
    runs = []
    for batch in sorted(rows):
        for with_drafts in ([], drafts):
            stats = min((decoded(batch, with_drafts).stats for _ in range(repeats)), key=lambda s: s.host_s)
            steps = len(stats.steps)
            runs.append((batch, sum(width for _, width, _ in stats.steps) / steps, stats.host_s / steps))
            progress(f"host rows {batch} nodes {runs[-1][1]:.1f}: {runs[-1][2] * 1000:.2f} ms a step")
    return fit_host(runs)


def measure_profile(
    target: Any, model: str, *, rows: tuple[int, ...] = ROWS, nodes: tuple[int, ...] = NODES,
    contexts: tuple[int, ...] = CONTEXTS, image_sides: tuple[int, ...] = IMAGE_SIDES, max_tokens: int = MAX_TOKENS,
    host_rows: tuple[int, ...] = HOST_ROWS, repeats: int = 2, progress: Callable[[str], None] = lambda line: None,
) -> Profile:
    """The forwards over the grid, the prefills by picture side and the host work of a step
    (measured at the smallest context; none where `host_rows` is empty)."""
    forwards = measure_forwards(target, rows, nodes, contexts, max_tokens, repeats, progress)
    prefills = measure_prefills(target, image_sides, repeats, progress)
    host = measure_host(target, min(contexts), host_rows, repeats, progress) if host_rows else HostCost()
    device, dtype = str(target.device), str(target.dtype).removeprefix("torch.")
    return Profile(
        name=profile_name(model, device, dtype), model=model, device=device, dtype=dtype,
        kind="measured", forwards=forwards, prefills=prefills, host=host,
    )
