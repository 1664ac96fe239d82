"""`hsd device-check`: what a GPU would confirm, in one command and one JSON, for the day one is at
hand (docs/BENCHMARKS.md holds CPU measurements and analytic projections only):

1. every tiny family's exactness in bf16 on the device: our loop's plain decoding equal to
   transformers' `generate` token for token, and speculative decoding (a whole draft, and a noisy
   one) equal to it but at a near-tie of bf16 logits (tests/decoding/test_bf16.py's rule);
2. `hsd profile` of a replay model on the device (a grid sized to the rows benched);
3. `hsd bench throughput` with that replay model at the given rows (1, 8 and 32), sized and
   projected on the profile just measured;
with the versions of everything that decides the figures. Without CUDA it says so in one line and
exits 4 (the device is unavailable), before any work.
"""

from __future__ import annotations

import json
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

PROMPT = "Transcribe the text."
LENGTH = 128  # tokens each exactness run decodes (test_bf16's length)
PROFILE_NODES = (1, 4, 16, 64)
PROFILE_CONTEXTS = (512, 2048)
PROFILE_SIDES = (448, 896, 1344)


@dataclass(frozen=True)
class CheckPlan:
    """What one device check runs (resolved once from the options)."""

    device: str
    families: tuple[str, ...]
    replay_model: str  # a directory
    pages: tuple[str, ...]
    rows: tuple[int, ...]
    repeats: int
    max_new_tokens: int | None


def versions() -> dict[str, Any]:
    import torch
    import transformers

    from hsd_cli import __version__

    cuda = torch.cuda.is_available()
    return {
        "hsd": __version__, "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "device_name": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
        "device_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
    }


def noisy(tokens: list[int], seed: int, rate: float = 0.1) -> list[int]:
    """The tokens with about `rate` of them substituted, inserted or deleted each (a draft with errors)."""
    rng, out = random.Random(seed), []
    for token in tokens:
        roll = rng.random()
        if roll < rate:
            continue
        if roll < 2 * rate:
            out.append(rng.randrange(10, 1000))
        out.append(rng.randrange(10, 1000) if rng.random() < rate else token)
    return out


def verdict(tokens: list[int], reference: list[int], logits: Any) -> str:
    """"identical"; "near-tie at token N" where it left `generate` at a near-tie of bf16 logits for
    one of the tied tokens (allowed: another matmul shape rounds otherwise); else "diverged at token N"."""
    import math

    divergence = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    if divergence is None:
        return "identical" if len(tokens) == len(reference) else f"diverged at token {min(len(tokens), len(reference))}"
    top = logits[divergence].max().item()
    unit = 2.0 ** (math.floor(math.log2(abs(top))) - 7) if top else 0.0  # bf16's spacing around the best logit
    tied = (logits[divergence] >= top - unit).nonzero().view(-1).tolist()
    return f"near-tie at token {divergence}" if len(tied) >= 2 and tokens[divergence] in tied else f"diverged at token {divergence}"


def family_exactness(family: str, device: str, workdir: Path) -> dict[str, Any]:
    """One tiny family in bf16 on `device`: plain and speculative decoding against `generate`."""
    import numpy as np
    import torch
    from PIL import Image

    from hsd_cli.decoding import load_target
    from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch
    from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
    from hsd_cli.models.tiny_families import build_tiny_random

    target = load_target(str(build_tiny_random(family, workdir / family)), device=device, dtype="bfloat16")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 100, 3), dtype=np.uint8))
    inputs = target.inputs([image], [PROMPT])
    out = target.model.generate(**inputs, max_new_tokens=LENGTH, do_sample=False, output_logits=True, return_dict_in_generate=True)
    reference = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    logits = torch.stack(out.logits)[:, 0].float()
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)

    def decoded(proposer: Any) -> Any:
        return decode_batch(target, [DecodeRequest(image, PROMPT, proposer)], config)[0]

    plain = decoded(NoDraftProposer())
    drafted = {"whole draft": decoded(DraftProposer([reference])), "noisy draft": decoded(DraftProposer([noisy(reference, 1)]))}
    speculative = {name: verdict(result.tokens, reference, logits) for name, result in drafted.items()}
    return {
        "plain": "identical" if plain.tokens == reference else verdict(plain.tokens, reference, logits),
        "speculative": speculative,
        "accepted": {name: result.stats.accepted for name, result in drafted.items()},
        "exact": plain.tokens == reference and not any(v.startswith("diverged") for v in speculative.values()),
    }


def measured_profile(plan: CheckPlan, progress: Callable[[str], None]) -> tuple[Any, Path]:
    """`hsd profile` of the replay model on the device, at the rows benched; stored in the user
    cache (the profile and its file)."""
    from hsd_cli.decoding import load_target
    from hsd_cli.profiles import save_profile
    from hsd_cli.profiles.measured import measure_profile

    target = load_target(plan.replay_model, device=plan.device, dtype="bfloat16")
    profile = measure_profile(
        target, plan.replay_model, rows=plan.rows, nodes=PROFILE_NODES, contexts=PROFILE_CONTEXTS, image_sides=PROFILE_SIDES,
        max_tokens=max(plan.rows) * max(PROFILE_NODES), host_rows=plan.rows if len(plan.rows) > 1 else (1, 2), progress=progress,
    )
    return profile, save_profile(profile)


def bench_throughput(plan: CheckPlan, profile_path: Path, progress: Callable[[str], None]) -> dict[str, Any] | None:
    from hsd_cli.bench.throughput import BenchPlan, bench_report
    from hsd_cli.bench.throughput_runs import RowSearch
    from hsd_cli.config import ConvertConfig

    config = ConvertConfig(output_dir=Path("."), model=plan.replay_model, device=plan.device, dtype="bfloat16",
                           max_new_tokens=plan.max_new_tokens, profile=str(profile_path))
    return bench_report(config, plan.pages, BenchPlan(RowSearch(plan.rows), plan.repeats), plan.rows, None, progress)


def timed(seconds: dict[str, float], part: str, work: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    try:
        return work()
    finally:
        seconds[part] = round(time.perf_counter() - started, 1)


def run_check(plan: CheckPlan, progress: Callable[[str], None]) -> dict[str, Any]:
    """Every part of the check, its figures and seconds, and the versions: the JSON written."""
    seconds: dict[str, float] = {}
    report: dict[str, Any] = {"versions": versions(), "device": plan.device, "dtype": "bfloat16", "seconds": seconds}
    with tempfile.TemporaryDirectory(prefix="hsd-device-check-") as workdir:
        for family in plan.families:
            progress(f"exactness: {family}")
            report.setdefault("exactness", {})[family] = timed(seconds, f"exactness {family}", lambda: family_exactness(family, plan.device, Path(workdir)))
    report["exact"] = all(entry["exact"] for entry in report.get("exactness", {}).values())
    progress(f"profile: {plan.replay_model}")
    profile, path = timed(seconds, "profile", lambda: measured_profile(plan, progress))
    report["profile"] = profile.to_json()
    report["throughput"] = timed(seconds, "throughput", lambda: bench_throughput(plan, path, progress))
    seconds["total"] = round(sum(seconds.values()), 1)
    return report


def _fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _pages(replay_dir: Path, given: list[str] | None) -> tuple[str, ...]:
    """The pages benched: those given, else the pages the replay model was built on (it reads no other)."""
    if given:
        return tuple(given)
    record = replay_dir / "replay.json"
    inputs = json.loads(record.read_text()).get("source", {}).get("inputs") if record.is_file() else None
    if not inputs or not Path(inputs).is_dir():
        _fail(f"{replay_dir}: no build inputs recorded or present; give --pages with the documents it was built on", 2)
    return (inputs,)


def device_check(
    output: Annotated[Path, typer.Option("-o", "--output", help="The JSON written.")] = Path("device-check.json"),
    replay_model: Annotated[str, typer.Option(help="The replay model profiled and benched (a name or directory).")] = "olmocr-replay-qwen2",
    pages: Annotated[list[str] | None, typer.Option(help="Documents benched (default: those the replay model was built on).")] = None,
    families: Annotated[str, typer.Option(help="Tiny families checked for exactness, comma-separated, or all.")] = "all",
    rows: Annotated[str, typer.Option(help="Row counts profiled and benched, comma-separated.")] = "1,8,32",
    repeats: Annotated[int, typer.Option(min=1, help="Interleaved repeats of the throughput bench.")] = 3,
    max_new_tokens: Annotated[int | None, typer.Option(help="Token budget per page in the bench (default: the family's).")] = None,
    device: Annotated[str, typer.Option(help="cuda; cpu runs the same check here (slowly: to try the command).")] = "cuda",
) -> None:
    """On a CUDA machine, in about 8 minutes: every tiny family's exactness in bf16 on the device,
    `hsd profile` of a replay model and the throughput bench with it at 1, 8 and 32 rows; one JSON
    with every figure and the versions. Without CUDA: one line, exit 4."""
    import torch

    if device not in ("cuda", "cpu"):
        _fail(f"--device must be cuda or cpu, got {device!r}", 2)
    if device == "cuda" and not torch.cuda.is_available():
        _fail(f"no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
              "hsd device-check runs on a GPU (--device cpu tries it on this CPU)", 4)
    from hsd_cli.bench.loading import bench_model_path
    from hsd_cli.bench.throughput import row_counts
    from hsd_cli.models.tiny_families import TINY_FAMILIES

    chosen = TINY_FAMILIES if families == "all" else tuple(f.strip() for f in families.split(",") if f.strip())
    unknown = [family for family in chosen if family not in TINY_FAMILIES]
    if unknown or not chosen:
        _fail(f"--families: unknown {', '.join(unknown) or 'none given'}; known: {', '.join(TINY_FAMILIES)}", 2)
    replay_dir = bench_model_path(replay_model)
    plan = CheckPlan(device, chosen, replay_dir, _pages(Path(replay_dir), pages), row_counts(rows, "--rows"), repeats, max_new_tokens)
    report = run_check(plan, lambda line: print(line, file=sys.stderr))
    output.write_text(json.dumps(report, indent=1))
    print(f"wrote {output}: exact on every family: {report['exact']}; {report['seconds']['total']:.0f} s", file=sys.stderr)
    if not report["exact"]:
        raise typer.Exit(1)
