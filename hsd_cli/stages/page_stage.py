"""The page stage: the model reads the whole page, verifying the page's drafts (the region
outputs and the pipeline's text). Only its output reaches the user. Also the plain reading that
`--baseline` compares it with.

Knows nothing about trees: it hands the picture, the prompt and the draft texts to the decoding core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from hsd_cli.decoding import DecodeResult, DecodeStats, repetition_stop
from hsd_cli.models.family_settings import ModelSettings
from hsd_cli.records.page import Reading
from hsd_cli.stages.blocks import plain_reads
from hsd_cli.stages.dialect import DIALECT_KEYS, split_front_matter
from hsd_cli.stages.grounding import split_grounding
from hsd_cli.stages.math_policy import near_lossless_rule
from hsd_cli.records.totals import BaselineCheck

if TYPE_CHECKING:
    from hsd_cli.serving.reader import Reader

# A page whose front matter says it is rotated is turned by the model's correction and read again,
# as olmOCR does (its pipeline turns the image with these transposes, up to 8 reads; hsd: 4).
ROTATION_REREADS = 3
_TURN = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}


def rotation_correction(front_matter: dict[str, Any] | None) -> int:
    """The degrees the front matter says the page must be turned by, 0 where it is upright."""
    if not front_matter or front_matter.get("is_rotation_valid") is not False:
        return 0
    correction = front_matter.get("rotation_correction")
    return correction if correction in _TURN else 0


def page_stage(
    model: Reader, picture: Image.Image, drafts: list[str], settings: ModelSettings, upright: DecodeResult | None = None,
) -> Reading:
    """The page's reading, verifying `drafts` (`upright`: the upright picture's reading where it
    was decoded already, as the packed stage does); where the output's front matter says the page
    is rotated, the picture turned by the model's correction and read again. Under
    --near-lossless, every read takes close draft tokens outside math (stages.math_policy), and
    the reading says so."""
    rule = near_lossless_rule(model)

    def read(turned: Image.Image) -> DecodeResult:
        return model.decode(turned, model.settings.page_prompt, drafts, near_lossless=rule)

    return replace(upright_read(picture, settings, read, upright), near_lossless=rule.tau if rule else None)


def plain_page_stage(model: Reader, picture: Image.Image, settings: ModelSettings, drafts: Sequence[str] = ()) -> Reading:
    """The page read with transformers' own generate (plain greedy, one forward per token), turned
    and read again as `page_stage` does: what a user of the model runs without hsd. The page's
    `drafts` are not verified; the repetition they hold is structure to the guard, as in `page_stage`."""
    config, allowance = model.decode_config, model.allowance(drafts)

    def read(turned: Image.Image) -> DecodeResult:
        prompt, budget = model.settings.page_prompt, config.max_new_tokens
        tokens = model.generate_plainly(turned, prompt, budget, config.repetition_guard, allowance)
        # After the prefill's token, one forward of one node per token: the shapes a profile prices.
        stats = DecodeStats(forwards=len(tokens), new_tokens=len(tokens), steps=[(1, 1, i) for i in range(1, len(tokens))])
        looped = config.repetition_guard and repetition_stop(tokens, allowance) == len(tokens)
        stop = "repetition" if looped else "budget" if len(tokens) >= config.max_new_tokens else "eos"
        return model.result(tokens, stats, stop)

    return upright_read(picture, settings, read)


def turned(picture: Image.Image, rotation: int) -> Image.Image:
    return picture.transpose(_TURN[rotation]) if rotation else picture


def upright_read(
    picture: Image.Image, settings: ModelSettings, read: Callable[[Image.Image], DecodeResult],
    upright: DecodeResult | None = None,
) -> Reading:
    """`read` of the picture (`upright`: that reading, where it was decoded already); where the
    output's front matter says the page is rotated, of the picture turned by the model's
    correction, up to ROTATION_REREADS more times."""
    rotation, earlier = 0, ()
    result = upright if upright is not None else read(picture)
    while True:
        output = result.text.strip()
        # The front matter goes to the JSON; the Markdown is the page's text.
        front_matter, body = split_front_matter(output) if settings.front_matter != "none" else (None, output)
        correction = rotation_correction(front_matter)
        if not correction or len(earlier) >= ROTATION_REREADS:
            dialect = {name: getattr(settings, name) for name in DIALECT_KEYS}
            # The grounding tags go to the JSON too.
            grounding, body = split_grounding(body, settings.grounding)
            return Reading(result, front_matter, body, dialect, rotation, earlier, grounding=grounding)
        earlier += (result.stats,)
        rotation = (rotation + correction) % 360
        result = read(turned(picture, rotation))


def baseline_check(model: Reader, picture: Image.Image, read: Reading) -> BaselineCheck:
    """The picture the page stage last read (`picture` turned as it was; a two-step reading's
    layout step and blocks, `blocks.plain_reads`) decoded with
    transformers' own generate (same model, dtype and cache: the baseline a user would otherwise
    run) without hsd's repetition guard, compared token by token with the page stage's output;
    where the guard stopped hsd's output, as far as it went. A near-lossless reading is also
    counted apart from it in tokens (`changed_tokens`)."""
    config = model.decode_config
    if read.blocks or read.layout is not None:
        plain = plain_reads(model, picture, read)
    else:
        plain = model.generate_plainly(turned(picture, read.rotation), model.settings.page_prompt, config.max_new_tokens)
    tokens = read.result.tokens
    guard_cut = read.result.stop_reason == "repetition" and len(plain) > len(tokens)
    compared = plain[: len(tokens)] if guard_cut else plain
    # Exact in fp32; in bf16 a near-tie can flip, so report where instead of asserting.
    divergence = next(
        (i for i, (a, b) in enumerate(zip(compared, tokens)) if a != b),
        None if len(compared) == len(tokens) else min(len(compared), len(tokens)),
    )
    return BaselineCheck(
        identical=divergence is None, first_divergence=divergence, forwards=len(plain),
        guard_stopped_at=len(tokens) if guard_cut else None,
        changed_tokens=token_edit_distance(compared, tokens) if read.near_lossless is not None else None,
    )


def token_edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """The fewest tokens inserted, deleted or replaced to turn `a` into `b` (Levenshtein over
    token ids). Not the tokens after the first divergence: a near-lossless output that takes one
    close token and then reads on as plain decoding does differs by one or two, not by the rest.
    Row by row in numpy: a row's insertions are a running minimum (d[j] = min over k <= j of
    t[k] + j - k), so a page of thousands of tokens costs milliseconds, not Python's seconds."""
    if not a or not b:
        return len(a) + len(b)
    second = np.asarray(b)
    steps = np.arange(len(b) + 1)
    previous = steps.copy()
    for i, token in enumerate(a, start=1):
        # Deletion from the row above, or a match or replacement from its diagonal...
        through = np.minimum(previous[1:] + 1, previous[:-1] + (second != token))
        current = np.concatenate(([i], through))
        # ...then insertions along the row.
        previous = np.minimum.accumulate(current - steps) + steps
    return int(previous[-1])
