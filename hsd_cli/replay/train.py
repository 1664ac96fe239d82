"""Training a replay model: teacher-forced cross-entropy on (image, prompt) -> published text,
with the first answer tokens up-weighted (only they depend on which page is shown; without the
extra weight the model learns the texts but recites the wrong page's). Every step adds a "head"
batch: several examples of similar prompt length cut after their first answer tokens, so that
each step contrasts different images with their different openings, which full examples (one
long page per batch) cannot do; each pass over the head batches takes them in a new order. A
build may start with an openings phase of head batches only: telling the images apart takes the
vision tower many more steps than reciting the bodies takes the LM, and learnt together at a high
rate the tower's output collapsed to one vector. A minute-limited build ends the phase early
rather than spend its whole budget there. The fast recipe (presets.py) keeps the tower at its
seeded initialisation instead (its features computed once) and, after its openings phase,
weights the first answer tokens inside the whole-example batches instead of adding head batches.

Deterministic for a seed and thread count: a fixed batch order per epoch, no dropout; a resumed
run continues exactly where the checkpoint stopped (bit for bit at the same thread count). It
ends when every example is reproduced by greedy decoding (checked teacher-forced, with a logit
margin), or at the step or time limit; the model then gets the weights of the best check.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hsd_cli.decoding.hf_target.families import IMAGE_FIRST, ChatLayout, adapter_for
from hsd_cli.models.tiny import QWEN_TOKENS
from hsd_cli.replay.model import (
    FAMILY,
    standardise_image_features,
    use_matmul_patch_projection,
    with_image_features,
)
from hsd_cli.replay.train_config import TrainConfig

CHECKPOINT_FILE = "replay_checkpoint/train_state.pt"


@dataclass(frozen=True)
class Encoded:
    """One example as the model sees it: the prompt (with image placeholders) and its answer."""

    prompt_ids: torch.Tensor  # (P,) long
    mm_token_type_ids: torch.Tensor  # (P,) int, 1 at image placeholders
    pixel_values: torch.Tensor  # (patches, channels * patch^2 * temporal)
    image_grid_thw: torch.Tensor  # (1, 3)
    answer_ids: torch.Tensor  # (A,) long, ending with the end-of-turn token
    # The vision tower's output for the image when the tower is not trained: computed once, so a
    # step runs the language model only.
    image_features: torch.Tensor | None = None  # (image tokens, text width)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.answer_ids)


@dataclass(frozen=True)
class TrainReport:
    steps: int
    epochs: int
    seconds: float  # training time over all resumed runs
    run_seconds: float  # training time of this run
    loss: float  # mean loss of the last epoch
    exact_examples: int  # examples whose every answer token is the argmax (last check)
    examples: int
    min_margin: float
    stop_reason: str  # "done", "steps" or "minutes"


def encode_examples(processor, items: Sequence[tuple[object, str, str]], layout: ChatLayout = IMAGE_FIRST) -> list[Encoded]:
    """(image, prompt, target text) -> model inputs, through the real processor and chat template,
    the turns laid out as the recipe the model is built on lays them out."""
    adapter = adapter_for(FAMILY)
    tokenizer = processor.tokenizer
    eos = tokenizer.convert_tokens_to_ids(QWEN_TOKENS.eos)
    encoded = []
    for image, prompt, target in items:
        text = adapter.chat_text(processor, prompt, with_image=True, layout=layout)
        batch = processor(text=[text], images=[image], return_tensors="pt")
        answer = tokenizer.encode(target, add_special_tokens=False) + [eos]
        encoded.append(
            Encoded(
                prompt_ids=batch["input_ids"][0],
                mm_token_type_ids=batch["mm_token_type_ids"][0],
                pixel_values=batch["pixel_values"],
                image_grid_thw=batch["image_grid_thw"],
                answer_ids=torch.tensor(answer, dtype=torch.long),
            )
        )
    return encoded


def make_batches(examples: Sequence[Encoded], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length so padding stays small; each group's padded size <= batch_tokens
    (a single longer example is its own group)."""
    order = sorted(range(len(examples)), key=lambda i: (examples[i].length, i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = examples[index].length  # sorted: the newest is the longest
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def _collate(examples: Sequence[Encoded], pad_id: int) -> tuple[dict, torch.Tensor]:
    """Right-padded model inputs and the labels at every position (-100 = none)."""
    width = max(e.length for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    mm_types = torch.zeros((len(examples), width), dtype=torch.int)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, e in enumerate(examples):
        prompt, answer = len(e.prompt_ids), len(e.answer_ids)
        input_ids[row, :prompt] = e.prompt_ids
        input_ids[row, prompt : prompt + answer] = e.answer_ids
        attention[row, : prompt + answer] = 1
        mm_types[row, :prompt] = e.mm_token_type_ids
        # The logits at position t predict token t + 1.
        labels[row, prompt - 1 : prompt + answer - 1] = e.answer_ids
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "mm_token_type_ids": mm_types,
        "image_grid_thw": torch.cat([e.image_grid_thw for e in examples]),
    }
    if all(e.image_features is not None for e in examples):
        inputs["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=[e.image_features for e in examples])}
    else:
        inputs["pixel_values"] = torch.cat([e.pixel_values for e in examples])
    return inputs, labels


def _answer_logits(model, inputs: dict, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits only where there is a label (the LM head over prompt positions is wasted work)."""
    hidden = model.model(**inputs, use_cache=False).last_hidden_state
    where = labels != -100
    return model.lm_head(hidden[where]).float(), where


def head(example: Encoded, tokens: int) -> Encoded:
    """The example cut after its first `tokens` answer tokens."""
    return replace(example, answer_ids=example.answer_ids[:tokens])


def head_batch_order(seed: int, pass_number: int, count: int) -> list[int]:
    """The head batches of one pass, in a seeded order of their own: made by prompt length, they
    come sorted by kind (crops, then pages), which a fixed cycle would train as runs of
    consecutive steps."""
    order = list(range(count))
    random.Random(f"heads {seed} {pass_number}").shuffle(order)
    return order


def batch_loss(model, examples: Sequence[Encoded], pad_id: int, first_tokens: int = 0, first_weight: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens of a batch, plus `first_weight` times the mean over
    each example's first `first_tokens` answer tokens (where the image decides the text)."""
    inputs, labels = _collate(examples, pad_id)
    logits, where = _answer_logits(model, inputs, labels)
    losses = F.cross_entropy(logits, labels[where], reduction="none")
    if not first_weight:
        return losses.mean()
    opening = (where.cumsum(1) <= first_tokens)[where]  # an example's answer labels are contiguous
    return losses.mean() + first_weight * losses[opening].mean()


@torch.no_grad()
def answer_margins(model, examples: Sequence[Encoded], batches, pad_id: int, bf16: bool) -> list[torch.Tensor]:
    """Per example (in `examples` order), teacher-forced: each answer token's logit minus the best
    other token's. Greedy decoding reproduces an example when all its margins are > 0."""
    model.eval()
    margins: list[torch.Tensor | None] = [None] * len(examples)
    for batch in batches:
        inputs, labels = _collate([examples[i] for i in batch], pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, where = _answer_logits(model, inputs, labels)
        gold = labels[where]
        gold_logit = logits.gather(1, gold[:, None])[:, 0]
        rival = logits.scatter(1, gold[:, None], float("-inf")).max(1).values
        margin = gold_logit - rival
        row_of = where.nonzero()[:, 0]
        for row, index in enumerate(batch):
            margins[index] = margin[row_of == row]
    model.train()
    return margins


def check_reproduction(model, examples: Sequence[Encoded], batches, pad_id: int, config: TrainConfig) -> tuple[int, float]:
    """(examples whose answer tokens are all the argmax, smallest argmax margin over all tokens)."""
    margins = answer_margins(model, examples, batches, pad_id, config.bf16)
    return sum(bool((m > 0).all()) for m in margins), min(float(m.min()) for m in margins)


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def checkpoint_opening_end(state: dict, config: TrainConfig) -> int:
    """The step at which a checkpoint's openings phase ends (cut short by time, or as configured:
    checkpoints from before the cut existed do not say)."""
    return state.get("opening_end", config.opening_steps)


# May differ between a checkpoint and the run resuming it: the limits (they may grow) and the
# thread count.
_RESUMABLE_SETTINGS = ("max_minutes", "max_steps", "checkpoint_minutes", "threads")


def _fixed_settings(settings: dict) -> dict:
    """The settings a resumed run must share with its checkpoint."""
    return {k: v for k, v in settings.items() if k not in _RESUMABLE_SETTINGS}


def openings_end(config: TrainConfig, end: int, step: int, seconds: float) -> int:
    """The step at which the openings phase ends, given where it was to end (`end`) and the build
    at `step` after `seconds` of training: a minute-limited build past `opening_share` of its
    minutes ends it now; a step-limited build stays deterministic and keeps its steps."""
    cut = config.max_steps is None and seconds >= config.opening_share * config.max_minutes * 60
    return min(end, step) if cut else end


def annealed_rate(rate: float, min_rate: float, budget_spent: float, anneal_fraction: float) -> float:
    """`rate` until the last `anneal_fraction` of the budget, then linearly down to `min_rate`."""
    start = 1.0 - anneal_fraction
    if anneal_fraction <= 0 or budget_spent <= start or rate <= min_rate:
        return rate
    return rate - (rate - min_rate) * min(1.0, (budget_spent - start) / anneal_fraction)


def rate_in_effect(config: TrainConfig, learning_rate: float, step: int, seconds: float) -> float:
    """The plateau rule's `learning_rate`, annealed by the budget spent after `step` steps and
    `seconds` of training (warm-up aside)."""
    if config.max_steps is not None:
        budget_spent = step / config.max_steps  # a step-limited build stays deterministic
    else:
        budget_spent = seconds / (config.max_minutes * 60)
    return annealed_rate(learning_rate, config.min_learning_rate, budget_spent, config.anneal_fraction)


def _save_checkpoint(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    os.replace(partial, path)  # a kill mid-write leaves the previous checkpoint intact


def train(
    model,
    examples: Sequence[Encoded],
    pad_id: int,
    config: TrainConfig,
    checkpoint: Path,
    resume: bool,
    log: Callable[[str], None] = lambda message: None,
) -> TrainReport:
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    if config.train_vision:
        use_matmul_patch_projection(model)
    else:
        # The tower keeps its seeded initialisation, whose features already tell the images apart;
        # trained, it collapsed them first (docs/BENCHMARKS.md), and it cost half of every step.
        model.model.visual.requires_grad_(False)
        standardise_image_features(model, with_image_features(model, examples))
        examples = with_image_features(model, examples)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.learning_rate, weight_decay=0.0)
    batches = make_batches(examples, config.batch_tokens)
    heads = [head(e, config.first_tokens) for e in examples]
    head_batches = make_batches(heads, config.head_batch_tokens)
    step, epoch, position, spent, losses = 0, 0, 0, 0.0, []
    opening_end = config.opening_steps
    learning_rate, best, stale = config.learning_rate, float("inf"), 0
    # The weights of the best completion check so far, as (exact examples, smallest margin): late
    # in training the margins oscillate around 0, and the last weights can be a worse pick.
    best_check, best_weights = (-1, float("-inf")), None
    if resume and checkpoint.is_file():
        state = load_checkpoint(checkpoint)
        # Settings added since the checkpoint was made take their defaults.
        made_with = {**asdict(TrainConfig()), **state["train_config"]}
        differing = [
            f"{key} {made_with[key]} (this run: {value})"
            for key, value in _fixed_settings(asdict(config)).items() if made_with[key] != value
        ]
        if differing:
            raise ValueError(
                f"{checkpoint} was made with {', '.join(differing)}: resume with its settings or build afresh without --resume"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, position, spent, losses = state["step"], state["epoch"], state["position"], state["seconds"], state["losses"]
        learning_rate, best, stale = state["learning_rate"], state["best"], state["stale"]
        best_check, best_weights = tuple(state["best_check"]), state["best_weights"]
        opening_end = checkpoint_opening_end(state, config)
        log(f"resumed at step {step} (epoch {epoch}, {spent / 60:.1f} min trained)")
    model.train()
    started = time.perf_counter() - spent
    last_saved = time.perf_counter()
    exact, min_margin, epoch_loss = 0, float("-inf"), float("nan")

    def save() -> None:
        _save_checkpoint(checkpoint, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "train_config": asdict(config),
            "step": step, "epoch": epoch, "position": position, "seconds": time.perf_counter() - started,
            "losses": losses, "learning_rate": learning_rate, "best": best, "stale": stale,
            "best_check": best_check, "best_weights": best_weights, "opening_end": opening_end,
        })

    stop_reason = None
    while stop_reason is None:
        order = list(range(len(batches)))
        random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
        while position < len(order):
            rate = rate_in_effect(config, learning_rate, step, time.perf_counter() - started)
            for group in optimizer.param_groups:
                group["lr"] = rate * min(1.0, (step + 1) / config.warmup_steps)
            passes, within = divmod(step, len(head_batches))
            head_batch = head_batches[head_batch_order(config.seed, passes, len(head_batches))[within]]
            openings_only = step < opening_end
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
                loss = 0.0 if openings_only else batch_loss(
                    model, [examples[i] for i in batches[order[position]]], pad_id, config.first_tokens, config.body_first_weight
                )
                # After the openings the head batches are optional (first_weight 0: none).
                head_weight = 1.0 if openings_only else config.first_weight
                if head_weight > 0:
                    loss = loss + head_weight * batch_loss(model, [heads[i] for i in head_batch], pad_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            losses.append(round(loss.item(), 5))
            step += 1
            if openings_only:
                opening_end = openings_end(config, opening_end, step, time.perf_counter() - started)
                if step == opening_end < config.opening_steps:
                    log(f"openings: ended at step {step} of {config.opening_steps}, at {config.opening_share:.0%} "
                        f"of the {config.max_minutes:g} minutes (the whole examples need the rest)")
                elif step % len(head_batches) == 0 or step == config.opening_steps:
                    recent = losses[-len(head_batches):]
                    log(f"openings: step {step} of {config.opening_steps}, loss {sum(recent) / len(recent):.4f}, "
                        f"rate {rate:.1e}, {(time.perf_counter() - started) / 60:.1f} min")
            else:
                position += 1
            if config.max_steps is not None and step >= config.max_steps:
                stop_reason = "steps"
                break
            if config.max_minutes is not None and time.perf_counter() - started >= config.max_minutes * 60:
                stop_reason = "minutes"
                break
            if time.perf_counter() - last_saved >= config.checkpoint_minutes * 60:
                save()
                last_saved = time.perf_counter()
        if position >= len(order):
            epoch_loss = sum(losses[-len(order):]) / len(order)
            epoch, position = epoch + 1, 0
            best, stale = (epoch_loss, 0) if epoch_loss < best else (best, stale + 1)
            if stale >= config.patience and learning_rate > config.min_learning_rate:
                learning_rate, stale = max(config.min_learning_rate, learning_rate / 2), 0
                log(f"  learning rate halved to {learning_rate:.2e}")
            log(f"epoch {epoch}: step {step}, loss {epoch_loss:.4f}, rate {rate:.1e}, "
                f"{(time.perf_counter() - started) / 60:.1f} min")
            if epoch_loss < config.check_below_loss:
                exact, min_margin = check_reproduction(model, examples, batches, pad_id, config)
                log(f"  reproduced {exact}/{len(examples)} examples, smallest margin {min_margin:.2f}")
                if (exact, min_margin) > best_check:
                    best_check = (exact, min_margin)
                    best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
                if exact == len(examples) and min_margin >= config.done_margin:
                    stop_reason = stop_reason or "done"
                elif exact == len(examples) and learning_rate > config.min_learning_rate:
                    # Everything is reproduced; smaller steps now widen the margins instead of
                    # trading one example's for another's.
                    learning_rate, stale = max(config.min_learning_rate, learning_rate / 2), 0
                    log(f"  learning rate halved to {learning_rate:.2e}")
    if stop_reason != "done":
        exact, min_margin = check_reproduction(model, examples, batches, pad_id, config)
    save()  # the last weights: a resumed run continues from them
    if best_weights is not None and best_check > (exact, min_margin):
        model.load_state_dict(best_weights)  # what the model directory gets
        exact, min_margin = best_check
        log(f"  kept the weights of the best check ({exact}/{len(examples)} reproduced)")
    recent = losses[-len(batches):]
    seconds = time.perf_counter() - started
    return TrainReport(
        steps=step, epochs=epoch, seconds=round(seconds, 1), run_seconds=round(seconds - spent, 1),
        loss=round(sum(recent) / max(1, len(recent)), 5), exact_examples=exact, examples=len(examples),
        min_margin=round(min_margin, 3), stop_reason=stop_reason,
    )
