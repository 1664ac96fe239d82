"""Cost profiles: what one forward of a model costs on a device, by batch rows, tree nodes per row
and context length, and what a page's prefill (vision encoder included) costs by image size.

A profile is measured (`hsd profile --model M`, or `--random-weights ARCH` for a real size built
here with random weights: the cost of a forward does not depend on the weights' values) or
analytic: computed for a device that is not present from its published memory bandwidth and
FLOPs and the model's shapes (formulas in docs/method.md, "Cost profiles"). Profiles are plain
JSON in the user cache, for the planner and the benchmarks' projections.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter
from typing import Annotated, Any

import numpy as np
import typer

ROWS = (1, 4, 8)
NODES = (1, 16, 64)
CONTEXTS = (512, 2048)
IMAGE_SIDES = (448, 896, 1344)


@dataclass(frozen=True)
class ForwardCost:
    rows: int
    nodes: int  # tree nodes per row, all verified in the forward
    context: int  # cache entries per row before the forward
    seconds: float


@dataclass(frozen=True)
class PrefillCost:
    image_side: int  # a square page picture of this many pixels a side
    tokens: int  # prompt tokens, the image's included
    seconds: float  # vision encoder and the prompt's forward


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    device: str
    dtype: str
    kind: str  # "measured" or "analytic"
    forwards: tuple[ForwardCost, ...]
    prefills: tuple[PrefillCost, ...]

    def forward_s(self, rows: int, nodes: int, context: int) -> float:
        """A forward's seconds, interpolated linearly on the grid (and extrapolated flat beyond it)."""
        grid = {(f.rows, f.nodes, f.context): f.seconds for f in self.forwards}
        rows_axis, nodes_axis, context_axis = (sorted({key[i] for key in grid}) for i in range(3))

        def along_context(r: int, n: int) -> float:
            return float(np.interp(context, context_axis, [grid[r, n, c] for c in context_axis]))

        def along_nodes(r: int) -> float:
            return float(np.interp(nodes, nodes_axis, [along_context(r, n) for n in nodes_axis]))

        return float(np.interp(rows, rows_axis, [along_nodes(r) for r in rows_axis]))

    def prefill_s(self, image_side: int) -> float:
        """A page prefill's seconds for a picture of this side (flat beyond the measured sides)."""
        return float(np.interp(image_side, [p.image_side for p in self.prefills], [p.seconds for p in self.prefills]))

    def prefill_tokens(self, image_side: int) -> int:
        return round(float(np.interp(image_side, [p.image_side for p in self.prefills], [p.tokens for p in self.prefills])))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        return cls(
            **{**data, "forwards": tuple(ForwardCost(**f) for f in data["forwards"]),
               "prefills": tuple(PrefillCost(**p) for p in data["prefills"])}
        )


def profiles_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hsd" / "profiles"


def profile_name(model: str, device: str, dtype: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{Path(model).name or model}-{device}-{dtype}").strip("-")


def save_profile(profile: Profile) -> Path:
    path = profiles_dir() / f"{profile.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_json(), indent=1))
    return path


def load_profile(name: str) -> Profile:
    """A stored profile by name, or a JSON file."""
    path = Path(name) if name.endswith(".json") else profiles_dir() / f"{name}.json"
    return Profile.from_json(json.loads(path.read_text()))


# -- measured ---------------------------------------------------------------------------------


def _text_prompt(target: Any, tokens: int) -> str:
    """A text prompt of about `tokens` tokens in the target's chat template."""
    unit = " page"
    per_unit = max(1, len(target.encode(unit * 100)) / 100)
    return (unit * int(tokens / per_unit)).strip()


def _best_of(repeats: int, run: Any) -> float:
    return min(run() for _ in range(repeats))


def measure_profile(
    target: Any, model: str, *, rows: tuple[int, ...] = ROWS, nodes: tuple[int, ...] = NODES,
    contexts: tuple[int, ...] = CONTEXTS, image_sides: tuple[int, ...] = IMAGE_SIDES, repeats: int = 2,
    progress: Any = lambda line: None,
) -> Profile:
    """Time tree forwards over the grid (a chain of `nodes` per row, after a cache of `context`
    entries; the forward's entries are dropped again after each) and one-row page prefills by
    image side."""
    import torch
    from PIL import Image

    forwards = []
    for context in contexts:
        # One row is prefilled; more rows are copies of it (prefilling 8 rows of a real size
        # costs minutes on a CPU, and a forward's cost does not depend on what the rows hold).
        state, _ = target.prefill(target.inputs([None], [_text_prompt(target, context)]))
        cached = int(state.past_len[0])
        for batch in sorted(rows):
            target.keep_rows(state, [0] * batch)
            for width in nodes:
                tokens = torch.full((batch, width), int(target.encode(" page")[0]), dtype=torch.long)
                depths = torch.arange(width).expand(batch, -1)
                chain = torch.tril(torch.ones(width, width, dtype=torch.bool)).expand(batch, -1, -1)

                def forward() -> float:
                    started = perf_counter()
                    target.forward_tree(state, tokens, depths, chain)
                    seconds = perf_counter() - started
                    target.commit(state, width, [[] for _ in range(batch)])  # back to `cached` entries
                    return seconds

                forward()  # warm-up: first use of a shape
                forwards.append(ForwardCost(batch, width, cached, _best_of(repeats, forward)))
                progress(f"forward rows {batch} nodes {width} context {cached}: {forwards[-1].seconds:.4f} s")
    prefills = []
    rng = np.random.default_rng(0)
    for side in image_sides:
        picture = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
        inputs = target.inputs([picture], ["Read this page."])

        def prefill() -> float:
            started = perf_counter()
            target.prefill(inputs)
            return perf_counter() - started

        prefills.append(PrefillCost(side, int(inputs["input_ids"].shape[1]), _best_of(repeats, prefill)))
        progress(f"prefill {side}x{side} ({prefills[-1].tokens} tokens): {prefills[-1].seconds:.3f} s")
    device, dtype = str(target.device), str(target.dtype).removeprefix("torch.")
    return Profile(
        name=profile_name(model, device, dtype), model=model, device=device, dtype=dtype,
        kind="measured", forwards=tuple(forwards), prefills=tuple(prefills),
    )


# -- analytic ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSpec:
    """Published peak figures of a device; the efficiencies are what decoding kernels reach of them."""

    name: str
    memory_bandwidth: float  # bytes/s
    peak_flops: float  # dense FLOP/s in `dtype`
    dtype: str
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.6
    forward_overhead_s: float = 0.004  # kernel launches and Python per forward (no CUDA graphs)


DEVICES = {
    "h100-bf16": DeviceSpec("NVIDIA H100 SXM", 3.35e12, 989e12, "bfloat16"),
    "a100-bf16": DeviceSpec("NVIDIA A100 SXM 80GB", 2.039e12, 312e12, "bfloat16"),
    "l4-bf16": DeviceSpec("NVIDIA L4", 300e9, 121e12, "bfloat16"),
}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The analytic model fed with what this machine's CPU measures (not published figures): to check
# the formulas against a measured profile of the same model here.
THIS_CPU = "this-cpu-float32"


def measure_this_cpu(repeats: int = 3) -> DeviceSpec:
    """This CPU's reachable read bandwidth (summing a 1 GiB tensor) and fp32 matmul FLOP/s (2048^3),
    with torch's threads; efficiencies 1 since these are reached, not peak, figures."""
    import torch

    values = torch.ones(2**28)
    left, right = torch.randn(2048, 2048), torch.randn(2048, 2048)

    def timed(work: Any) -> float:
        work()
        started = perf_counter()
        work()
        return perf_counter() - started

    read_s = min(timed(values.sum) for _ in range(repeats))
    matmul_s = min(timed(lambda: left @ right) for _ in range(repeats))
    return DeviceSpec(
        f"this CPU ({torch.get_num_threads()} threads)", values.numel() * 4 / read_s, 2 * 2048**3 / matmul_s, "float32",
        bandwidth_efficiency=1.0, flops_efficiency=1.0,
    )


@dataclass(frozen=True)
class ModelShape:
    """What the analytic cost needs of a model's config."""

    text_params: int  # read once per forward: every decoder layer, the embedding and the output layer
    layers: int
    hidden: int
    kv_bytes_per_token: int  # keys and values of every layer, per cached token (at 1 byte per value)
    vision_params: int
    patch: int
    merge: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModelShape:
        text = config.get("text_config") or config
        hidden, layers, ffn = text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"]
        heads, kv_heads = text["num_attention_heads"], text["num_key_value_heads"]
        head_dim = text.get("head_dim") or hidden // heads
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        embeddings = text["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
        vision = config["vision_config"]
        v_hidden, v_ffn, v_depth = vision["hidden_size"], vision["intermediate_size"], vision["depth"]
        merge = vision.get("spatial_merge_size", 2)
        merger = (v_hidden * merge**2) ** 2 + v_hidden * merge**2 * vision.get("out_hidden_size", hidden)
        return cls(
            text_params=layers * (attention + 3 * hidden * ffn) + embeddings,
            layers=layers,
            hidden=hidden,
            kv_bytes_per_token=2 * layers * kv_heads * head_dim,
            vision_params=v_depth * (4 * v_hidden**2 + 3 * v_hidden * v_ffn) + merger,
            patch=vision["patch_size"],
            merge=merge,
        )


def analytic_forward_s(shape: ModelShape, device: DeviceSpec, rows: int, nodes: int, context: int) -> float:
    """max(memory time, compute time) + overhead: the weights and the rows' caches are read once;
    every node costs 2 FLOPs per weight plus attention over its row's context."""
    width = _DTYPE_BYTES[device.dtype]
    read = shape.text_params * width + rows * (context + nodes) * shape.kv_bytes_per_token * width
    flops = 2 * shape.text_params * rows * nodes + 4 * shape.layers * shape.hidden * rows * nodes * (context + nodes)
    memory_s = read / (device.memory_bandwidth * device.bandwidth_efficiency)
    compute_s = flops / (device.peak_flops * device.flops_efficiency)
    return max(memory_s, compute_s) + device.forward_overhead_s


def analytic_prefill_s(shape: ModelShape, device: DeviceSpec, image_side: int, prompt_tokens: int = 40) -> tuple[int, float]:
    """(tokens, seconds) of a page's prefill: the vision encoder over the patches, then the prompt
    with the merged image tokens through the decoder; compute-bound."""
    patches = (image_side // shape.patch) ** 2
    tokens = patches // shape.merge**2 + prompt_tokens
    flops = 2 * shape.vision_params * patches + 2 * shape.text_params * tokens + 4 * shape.layers * shape.hidden * tokens**2
    compute_s = flops / (device.peak_flops * device.flops_efficiency)
    memory_s = (shape.text_params + shape.vision_params) * _DTYPE_BYTES[device.dtype] / (device.memory_bandwidth * device.bandwidth_efficiency)
    return tokens, max(compute_s, memory_s) + 2 * device.forward_overhead_s


def analytic_profile(device_name: str, architecture: str, config: dict[str, Any]) -> Profile:
    device = measure_this_cpu() if device_name == THIS_CPU else DEVICES[device_name]
    shape = ModelShape.of(config)
    forwards = tuple(
        ForwardCost(r, n, c, analytic_forward_s(shape, device, r, n, c)) for c in CONTEXTS for r in ROWS for n in NODES
    )
    prefills = tuple(PrefillCost(side, *analytic_prefill_s(shape, device, side)) for side in IMAGE_SIDES)
    return Profile(
        name=f"{architecture}-{device_name}", model=architecture, device=device.name, dtype=device.dtype,
        kind="analytic", forwards=forwards, prefills=prefills,
    )


# -- the command ------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def print_profile(profile: Profile) -> None:
    """Per context: a forward's seconds by rows x nodes, and what it costs against one node."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    for context in sorted({f.context for f in profile.forwards}):
        table = Table(title=f"{profile.name} ({profile.kind}): one forward, context {context}", title_justify="left")
        nodes_axis = sorted({f.nodes for f in profile.forwards})
        table.add_column("rows", justify="right")
        for nodes in nodes_axis:
            table.add_column(f"{nodes} nodes", justify="right")
        for rows in sorted({f.rows for f in profile.forwards}):
            cost = {f.nodes: f.seconds for f in profile.forwards if f.rows == rows and f.context == context}
            single = cost[nodes_axis[0]]
            table.add_row(str(rows), *(f"{cost[n] * 1000:.1f} ms ({cost[n] / single:.2f}x)" for n in nodes_axis))
        console.print(table)
    prefills = Table(title=f"{profile.name}: page prefill (vision encoder + prompt)", title_justify="left")
    for column in ("image", "tokens", "seconds"):
        prefills.add_column(column, justify="right")
    for p in profile.prefills:
        prefills.add_row(f"{p.image_side}x{p.image_side}", str(p.tokens), f"{p.seconds:.3f}")
    console.print(prefills)


def profile(
    model: Annotated[str | None, typer.Option(help="Model id or local directory to measure.")] = None,
    random_weights: Annotated[
        str | None,
        typer.Option(help="Measure a real-size architecture with random weights instead: a name in configs/architectures (qwen2_5_vl_3b, qwen2_5_vl_7b) or a config.json."),
    ] = None,
    analytic: Annotated[
        str | None, typer.Option(help=f"Compute the profile for a device not present, from its published figures: {', '.join(DEVICES)}; or {THIS_CPU}, from what this CPU measures (to check the formulas here).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or mps (default: what is present).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: as hsd convert; random weights: float32).")] = None,
    rows: Annotated[str, typer.Option(help="Batch rows to measure, comma-separated.")] = ",".join(map(str, ROWS)),
    nodes: Annotated[str, typer.Option(help="Tree nodes per row to measure, comma-separated.")] = ",".join(map(str, NODES)),
    contexts: Annotated[str, typer.Option(help="Context lengths (cached tokens) to measure, comma-separated.")] = ",".join(map(str, CONTEXTS)),
    image_sides: Annotated[str, typer.Option(help="Square page pictures (pixels a side) whose prefill is measured.")] = ",".join(map(str, IMAGE_SIDES)),
    repeats: Annotated[int, typer.Option(help="Runs per measurement; the fastest counts.")] = 2,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the profile as one JSON object on stdout.")] = False,
) -> None:
    """Measure what a forward of a model costs on this device (batch rows x tree nodes x context,
    and page prefills), or compute it for a device not present; store it in the user cache."""
    import sys

    if (model is None) == (random_weights is None):
        raise typer.BadParameter("give one of --model and --random-weights")
    if analytic is not None and analytic not in (*DEVICES, THIS_CPU):
        raise typer.BadParameter(f"unknown device {analytic!r}; known: {', '.join((*DEVICES, THIS_CPU))}", param_hint="--analytic")
    from hsd_cli.models.tiny import architecture_config

    if analytic:
        if random_weights:
            config, name = architecture_config(random_weights), Path(random_weights).stem
        else:
            config, name = json.loads((Path(model) / "config.json").read_text()), Path(model).name
        result = analytic_profile(analytic, name, config)
    else:
        import torch

        if threads:
            torch.set_num_threads(threads)
        if random_weights:
            from hsd_cli.models.tiny import random_target

            target = random_target(random_weights, device=device, dtype=dtype or "float32")
            source = f"random:{Path(random_weights).stem}"
        else:
            from hsd_cli.decoding import load_target

            target = load_target(model, device=device, dtype=dtype)
            source = model
        result = measure_profile(
            target, source, rows=_ints(rows), nodes=_ints(nodes), contexts=_ints(contexts),
            image_sides=_ints(image_sides), repeats=repeats, progress=lambda line: print(line, file=sys.stderr),
        )
    path = save_profile(result)
    print_profile(result)
    print(f"stored as {result.name}: {path}", file=sys.stderr)
    if json_output:
        print(json.dumps(result.to_json()))
