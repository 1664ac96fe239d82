"""`hsd bench decode`: plain decoding vs our speculative loop, one process, one model, same prompts.

Arms:
- `ar`: plain greedy `generate`;
- `hsd`: our loop with external drafts (the prompt does not contain them);
- `ar_anchor`, `pld_anchor`, `hsd_anchor`: the draft text placed in the prompt; plain greedy vs
  transformers prompt-lookup decoding vs our loop with the same draft.
Speculative arms are compared token for token with their plain reference (`ar`, `ar_anchor`).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Annotated

import typer

from hsd_cli.decoding.stats import speedup, tau

ARMS = ("ar", "hsd", "ar_anchor", "pld_anchor", "hsd_anchor")
PROMPT = "Transcribe the text of this page."
ANCHOR_PROMPT = "Transcribe the text of this page. A draft transcription follows; correct it.\n\nDraft:\n{draft}"


@dataclass
class ArmResult:
    """Sums over all prompts of one arm."""

    total_s: float = 0.0  # prefill + decode, wall clock
    prefill_s: float = 0.0
    forwards: int = 0
    new_tokens: int = 0
    propose_s: float = 0.0  # our loop only: proposer + tree construction
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    def summary(self, reference: ArmResult | None) -> dict:
        return {
            "decode_s": round(self.decode_s, 4),
            "total_s": round(self.total_s, 4),
            "prefill_s": round(self.prefill_s, 4),
            "forwards": self.forwards,
            "new_tokens": self.new_tokens,
            "tau": round(tau(self.new_tokens, self.forwards), 3),
            "identical_to_ar": None if reference is None else self.outputs == reference.outputs,
            "propose_share": round(self.propose_s / self.decode_s, 4) if self.propose_s else None,
        }


def noisy_tokens(tokens: Sequence[int], share: float, rng: random.Random, vocab: Sequence[int]) -> list[int]:
    """Edit about `share` of the tokens; each edit is a substitution, insertion or deletion."""
    out: list[int] = []
    for token in tokens:
        if rng.random() >= share:
            out.append(token)
            continue
        kind = rng.randrange(3)
        if kind == 0:
            out.append(rng.choice(vocab))
        elif kind == 1:
            out.extend((rng.choice(vocab), token))
    return out


def synthetic_pages(count: int, seed: int) -> list:
    """Seeded noise images of a few sizes (a tiny random model cannot read anyway)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(84, 112), (112, 84), (112, 112), (56, 112)]
    return [Image.fromarray(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8)) for i in range(count)]


class ForwardCounter:
    """Counts forward passes of the model (generate hides them) through a forward hook."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.count += 1

    def close(self):
        self._handle.remove()


@dataclass(frozen=True)
class Run:
    total_s: float
    prefill_s: float
    propose_s: float
    forwards: int
    tokens: list[int]


def best_of(repeats: int, run: Callable[[], Run]) -> Run:
    """The fastest of `repeats` identical runs (timings on a shared machine only get slower)."""
    runs = [run() for _ in range(repeats)]
    if any(r.tokens != runs[0].tokens for r in runs):
        raise RuntimeError("repeated runs of one arm gave different tokens")
    return min(runs, key=lambda r: r.total_s - r.prefill_s)


def add_run(result: ArmResult, run: Run) -> None:
    result.total_s += run.total_s
    result.prefill_s += run.prefill_s
    result.propose_s += run.propose_s
    result.forwards += run.forwards
    result.new_tokens += len(run.tokens)
    result.outputs.append(run.tokens)


def run_generate(target, image, prompt: str, max_new_tokens: int, sampling, **generate_kwargs) -> Run:
    """One plain `generate` (greedy or keyed sampling; prompt lookup with `prompt_lookup_num_tokens`),
    without the checkpoint's own logit shaping (a repetition penalty and the like)."""
    generate_kwargs["sampling"] = sampling
    prefill_start = perf_counter()
    target.generate_plainly(image, prompt, 1, **generate_kwargs)
    prefill_s = perf_counter() - prefill_start
    counter = ForwardCounter(target.model)
    start = perf_counter()
    tokens = target.generate_plainly(image, prompt, max_new_tokens, **generate_kwargs)
    total_s = perf_counter() - start
    counter.close()
    return Run(total_s, prefill_s, 0.0, counter.count, tokens)


def run_hsd(target, image, prompt: str, draft_tokens: list[list[int]], config, proposer_config) -> Run:
    from hsd_cli.decoding import DecodeRequest, DraftProposer, decode_batch

    proposer = DraftProposer(draft_tokens, proposer_config)
    start = perf_counter()
    (decoded,) = decode_batch(target, [DecodeRequest(image, prompt, proposer)], config)
    total_s = perf_counter() - start
    stats = decoded.stats
    return Run(total_s, stats.prefill_s, stats.propose_s, stats.forwards, decoded.tokens)


def make_drafts(target, reference: ArmResult, noise: float, seed: int) -> list[list[int]]:
    """Drafts from the `ar` outputs with `noise` of their tokens edited (ordinary, non-special ids)."""
    special = set(target.tokenizer.all_special_ids)
    vocab = [i for i in range(len(target.tokenizer)) if i not in special]
    rng = random.Random(seed)
    return [noisy_tokens(tokens, noise, rng, vocab) for tokens in reference.outputs]


def run_bench(
    target,
    images: Sequence,
    arms: Sequence[str],
    max_new_tokens: int,
    noise: float,
    seed: int,
    draft_texts: Sequence[str] | None,
    proposer_config,
    pld_tokens: int,
    repeats: int,
    sampling,
    progress: Callable[[str], None],
) -> dict:
    from hsd_cli.decoding import DecodeConfig

    config = DecodeConfig(max_new_tokens=max_new_tokens, repetition_guard=False, sampling=sampling)
    results = {name: ArmResult() for name in ARMS}
    run_generate(target, images[0], PROMPT, 4, sampling)  # warm-up: lazy initialisation is not timed

    progress("ar")
    for image in images:
        add_run(results["ar"], best_of(repeats, lambda: run_generate(target, image, PROMPT, max_new_tokens, sampling)))
    if draft_texts is not None:
        drafts = [target.encode(text) for text in draft_texts]
    else:
        drafts = make_drafts(target, results["ar"], noise, seed)
    texts = list(draft_texts) if draft_texts is not None else [target.decode(d) for d in drafts]
    # Prompt lookup copies n-grams from the prompt, image placeholders included, which breaks
    # transformers' VLM forward; suppressed tokens are never proposed (and never emitted).
    vision_ids = target.vision_token_ids
    pld = dict(suppress_tokens=vision_ids, prompt_lookup_num_tokens=pld_tokens)

    for name in arms:
        if name == "ar":
            continue
        progress(name)
        for image, draft, text in zip(images, drafts, texts):
            anchored = ANCHOR_PROMPT.format(draft=text)
            arm_runs = {
                "hsd": lambda: run_hsd(target, image, PROMPT, [draft], config, proposer_config),
                "hsd_anchor": lambda: run_hsd(target, image, anchored, [draft], config, proposer_config),
                "ar_anchor": lambda: run_generate(target, image, anchored, max_new_tokens, sampling, suppress_tokens=vision_ids),
                "pld_anchor": lambda: run_generate(target, image, anchored, max_new_tokens, sampling, **pld),
            }
            add_run(results[name], best_of(repeats, arm_runs[name]))

    def reference_of(name: str) -> ArmResult | None:
        ref = "ar_anchor" if name.endswith("_anchor") else "ar"
        return results[ref] if name != ref and ref in arms else None

    summary = {name: results[name].summary(reference_of(name)) for name in arms}
    report: dict = {"arms": summary}
    ratios = {}
    for fast, slow in (("hsd", "ar"), ("hsd_anchor", "ar_anchor"), ("hsd_anchor", "pld_anchor"), ("pld_anchor", "ar_anchor")):
        if fast in arms and slow in arms and results[fast].decode_s > 0:
            ratios[f"{fast}_vs_{slow}"] = round(speedup(results[slow].decode_s, results[fast].decode_s), 3)
    report["decode_speedup"] = ratios
    return report


def runnable_arms(target, arms: Sequence[str]) -> list[str]:
    """The arms the model can run: transformers refuses prompt lookup (assisted generation) with
    stateful models (a hybrid's linear-attention states), so their pld_anchor arm is left out, and said."""
    if "pld_anchor" in arms and getattr(target.model, "_is_stateful", False):
        print("pld_anchor left out: transformers' prompt lookup does not run stateful models", file=sys.stderr)
        return [arm for arm in arms if arm != "pld_anchor"]
    return list(arms)


def print_table(report: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("arm", "decode s", "prefill s", "forwards", "new tokens", "tau", "identical", "propose share"):
        table.add_column(column, justify="right" if column != "arm" else "left")
    for name, arm in report["arms"].items():
        identical = "-" if arm["identical_to_ar"] is None else ("yes" if arm["identical_to_ar"] else "NO")
        share = "-" if arm["propose_share"] is None else f"{arm['propose_share']:.1%}"
        table.add_row(
            name, f"{arm['decode_s']:.3f}", f"{arm['prefill_s']:.3f}", str(arm["forwards"]), str(arm["new_tokens"]),
            f"{arm['tau']:.2f}", identical, share,
        )
    console = Console(stderr=True)
    console.print(table)
    for name, ratio in report["decode_speedup"].items():
        console.print(f"decode speedup {name}: {ratio:.2f}x")


def decode(
    model: Annotated[str | None, typer.Option(help="Model id or local directory.")] = None,
    tiny_random: Annotated[
        str | None, typer.Option(help="Build a tiny random model of this family instead (every family hsd serves: `hsd models`).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or mps (default: what is present).")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32, bfloat16 or float16 (default: float32 for tiny models, else as hsd convert).")
    ] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model code from the model's repository.")] = False,
    image: Annotated[list[Path] | None, typer.Option(help="Page images (repeatable); default: synthetic images.")] = None,
    prompts: Annotated[int, typer.Option(help="Number of synthetic images when no --image is given.")] = 3,
    drafts: Annotated[
        Path | None, typer.Option(help="JSON list of draft texts, one per image (default: made from the ar output).")
    ] = None,
    draft_noise: Annotated[float, typer.Option(help="Share of draft tokens edited when drafts are made from ar.")] = 0.05,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 300,
    arms: Annotated[str, typer.Option(help="Comma-separated arms to run.")] = ",".join(ARMS),
    chain_max: Annotated[int, typer.Option(help="Longest chain proposed on a unique match.")] = 32,
    trie_budget: Annotated[int, typer.Option(help="Draft nodes per trie.")] = 40,
    pld_tokens: Annotated[int, typer.Option(help="prompt_lookup_num_tokens for the pld_anchor arm.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed for synthetic images, draft noise and the tiny model.")] = 0,
    repeats: Annotated[int, typer.Option(help="Runs per arm and prompt; the fastest counts.")] = 1,
    temperature: Annotated[float, typer.Option(help="0 = greedy; else keyed sampling (seeded by --seed) in every arm.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sampling: keep the k most likely tokens (0 = off).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sampling: nucleus mass.")] = 1.0,
    threads: Annotated[int, typer.Option(help="torch CPU threads.")] = 1,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Benchmark plain vs speculative decoding on the same model and prompts."""
    import torch
    from PIL import Image
    from transformers.utils import logging as hf_logging

    from hsd_cli.bench.loading import bench_model_path
    from hsd_cli.decoding import ProposerConfig, SamplingConfig, load_target
    from hsd_cli.decoding.tree import WIDTH_BUCKETS
    from hsd_cli.models.tiny_families import TINY_FAMILIES, build_tiny_random

    chosen_arms = [a.strip() for a in arms.split(",") if a.strip()]
    unknown = set(chosen_arms) - set(ARMS)
    if unknown or (model is None) == (tiny_random is None):
        raise typer.BadParameter(f"give exactly one of --model / --tiny-random; arms must be among {ARMS}")
    if tiny_random is not None and tiny_random not in TINY_FAMILIES:
        raise typer.BadParameter(f"no tiny random model of {tiny_random!r}; families: {', '.join(TINY_FAMILIES)}", param_hint="--tiny-random")
    # A tree is its drafted nodes and its root; the KV store budgets a row's slots for the widest
    # bucket (serving.rows.row_slots), which every tree must fit.
    for name, nodes in (("--chain-max", chain_max), ("--trie-budget", trie_budget)):
        if not 0 < nodes < WIDTH_BUCKETS[-1]:
            raise typer.BadParameter(f"must be 1 to {WIDTH_BUCKETS[-1] - 1} drafted nodes (a tree of at most {WIDTH_BUCKETS[-1]})",
                                     param_hint=name)
    if "ar" not in chosen_arms:
        chosen_arms.insert(0, "ar")  # drafts and the reference come from it
    torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    with tempfile.TemporaryDirectory() as scratch:
        if tiny_random:
            source = str(build_tiny_random(tiny_random, Path(scratch) / tiny_random, seed=seed))
            dtype = dtype or "float32"
        else:
            source = bench_model_path(model)
        target = load_target(source, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        chosen_arms = runnable_arms(target, chosen_arms)
        pages = [Image.open(p).convert("RGB") for p in image] if image else synthetic_pages(prompts, seed)
        draft_texts = json.loads(drafts.read_text()) if drafts else None
        if draft_texts is not None and len(draft_texts) != len(pages):
            raise typer.BadParameter(f"--drafts has {len(draft_texts)} texts for {len(pages)} images")
        report = run_bench(
            target, pages, chosen_arms, max_new_tokens, draft_noise, seed, draft_texts,
            ProposerConfig(chain_max=chain_max, trie_budget=trie_budget), pld_tokens, repeats,
            SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
            progress=lambda name: print(f"running {name} ...", file=sys.stderr),
        )
    report.update(
        model=model or f"tiny-random:{tiny_random}",
        device=str(target.device),
        dtype=str(target.dtype).removeprefix("torch."),
        images=len(pages),
        max_new_tokens=max_new_tokens,
        draft_noise=None if drafts else draft_noise,
        threads=threads,
        repeats=repeats,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    print_table(report, f"hsd bench decode: {report['model']}, noise {draft_noise:.0%}, {len(pages)} prompts")
    if json_output:
        print(json.dumps(report))
