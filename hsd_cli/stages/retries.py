"""The makers' retries (recipes.retry): a page whose answer the model's makers would not accept
(it ran out of budget or past their context, its front matter does not parse, their repeat
detector fires) is read again as their tool does, at the recipe's next attempt's temperature, until
an answer is accepted or the attempts run out; then the recipe's fallback stands in.

A retry reads the page alone: the region passes of the first attempt are drafts, not answers, so
they draft every attempt, and each earlier attempt's answer drafts the next (at a low temperature
most of it comes again). A rotated page is turned and read again within its attempt by the page
stage itself (stages.page_stage.upright_read), not here. A greedy attempt after a greedy one reads
the same input to the same answer, so it is not decoded: the makers' would give the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from hsd_cli.recipes.postprocess import POSTPROCESSORS
from hsd_cli.recipes.retry import retry_reasons
from hsd_cli.records.kinds import PageFlag
from hsd_cli.records.page import Page, Reading, RetriedRead, Way
from hsd_cli.stages.dialect import page_drafts, settled
from hsd_cli.stages.page_stage import page_stage, plain_page_stage

if TYPE_CHECKING:
    from hsd_cli.serving.reader import Reader

# Handled within an attempt by the page stage's rotation rereads.
WITHIN_ATTEMPT = frozenset({"rotation_invalid"})


def not_accepted(model: Reader, reading: Reading, prompt_tokens: int) -> tuple[str, ...]:
    """Why the recipe's makers would not accept the reading's answer (empty: they would)."""
    recipe, result = model.recipe, reading.result
    page = POSTPROCESSORS[recipe.output.postprocess](result.text, 0)
    reasons = retry_reasons(
        recipe.retry, page, stopped=result.stop_reason == "eos", total_tokens=prompt_tokens + len(result.tokens),
        raw=result.text, looped=result.stop_reason == "repetition",
    )
    return tuple(reason for reason in reasons if reason not in WITHIN_ATTEMPT)


def retried_read(reading: Reading, attempt: int, reasons: tuple[str, ...]) -> RetriedRead:
    new_tokens = reading.result.stats.new_tokens + sum(stats.new_tokens for stats in reading.earlier)
    return RetriedRead(attempt, reasons, reading.forwards, new_tokens)


def read_again(page: Page, model: Reader, first: Reading, answers: list[str], outputs_so_far: tuple[str, ...]) -> Reading:
    """The page read once more (as this thread's attempt samples), the way the first attempt read
    it: plainly where it did, else verifying the page's drafts, the first attempt's region
    outputs and the earlier attempts' answers."""
    settings = settled(model.settings, outputs_so_far)
    if page.plan.way is Way.PLAIN:
        return plain_page_stage(model, page.model_view, settings, page_drafts(page.blocks, settings, page_size=page.size_pt))
    region_texts = {region.block_id: region.text for region in first.regions if region.text is not None}
    drafts = page_drafts(page.blocks, settings, region_texts, page.size_pt) + answers
    return page_stage(model, page.model_view, drafts, settings)


def makers_attempts(
    page: Page, model: Reader, first: Reading, prompt_tokens: int, outputs_so_far: tuple[str, ...],
    clock: Callable[[], float],
) -> Reading:
    """The first reading, or the attempt after it the makers would accept, or their last; it
    records the attempts before it and, where none was accepted, why the last was not."""
    policy, reading, retried, answers = model.recipe.retry, first, (), [first.result.text]
    greedy_read = model.attempt_sampling(0).greedy
    reasons = not_accepted(model, reading, prompt_tokens)
    for attempt in range(1, policy.max_attempts):
        greedy = model.attempt_sampling(attempt).greedy
        if not reasons or (greedy and greedy_read):
            break
        retried += (retried_read(reading, attempt - 1, reasons),)
        started = clock()
        with model.attempt(attempt):
            again = read_again(page, model, first, answers, outputs_so_far)
        reading = replace(again, page_s=reading.page_s + clock() - started)
        answers.append(reading.result.text)
        greedy_read |= greedy
        reasons = not_accepted(model, reading, prompt_tokens)
    return replace(
        reading, retries=retried, not_accepted=reasons, regions=first.regions, region_s=first.region_s,
    )


def makers_fallback(page: Page, model: Reader, text_layer: Callable[[], str]) -> Page:
    """The page as the recipe's makers keep one whose answers they accepted none of: the PDF's
    text layer (olmOCR's pdftotext), nothing (DeepSeek-OCR-2 drops the page), or the last answer
    (Chandra; hsd's own recipes: the page as read, the repetition guard's draft completing a loop)."""
    reading, fallback = page.reading, model.recipe.output.fallback
    if not reading.not_accepted or fallback not in ("text_layer", "drop_page"):
        return page
    reasons = ", ".join(reading.not_accepted)
    attempts = reading.attempt + 1
    kept = "the PDF's text layer stands in" if fallback == "text_layer" else "the page is left out"
    notice = f"the model's makers accept none of its {attempts} answer(s) ({reasons}): {kept}, as their tool does"
    text = text_layer().strip() if fallback == "text_layer" else ""
    return replace(page, text=text, flags=(PageFlag.FALLBACK, PageFlag.NOT_ACCEPTED), draft_from=None, notice=notice)
