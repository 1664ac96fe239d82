"""`hsd profile`: measure a profile on this device, or compute one for a device not present;
store it in the user cache and print it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from hsd_cli.profiles import Profile, save_profile
from hsd_cli.profiles.analytic import DEVICES, THIS_CPU, analytic_profile
from hsd_cli.profiles.measured import CONTEXTS, HOST_ROWS, IMAGE_SIDES, MAX_TOKENS, NODES, ROWS, measure_profile


def _ints(text: str, option: str, *, least: int = 1, or_none: bool = False) -> tuple[int, ...]:
    """Comma-separated positive whole numbers, at least `least` distinct ones (or none, where `or_none`)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"comma-separated whole numbers, not {text!r}", param_hint=option) from None
    if any(value < 1 for value in values):
        raise typer.BadParameter(f"whole numbers of at least 1, not {text!r}", param_hint=option)
    if len(set(values)) < least and not (or_none and not values):
        raise typer.BadParameter(f"at least {least} distinct values{' or none' if or_none else ''}, not {text!r}", param_hint=option)
    return values


def print_profile(profile: Profile) -> None:
    """Per context: one node's forward in ms by rows, and wider forwards against it; the prefills
    by picture side; the host work of a step."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    nodes_axis = sorted({f.nodes for f in profile.forwards})
    for context in sorted({f.context for f in profile.forwards}):
        table = Table(
            title=f"{profile.name} ({profile.kind}): one forward at context {context}: ms for 1 node, wider against it",
            title_justify="left",
        )
        table.add_column("rows", justify="right")
        for nodes in nodes_axis:
            table.add_column(f"{nodes} nodes", justify="right")
        for rows in sorted({f.rows for f in profile.forwards}):
            cost = {f.nodes: f.seconds for f in profile.forwards if f.rows == rows and f.context == context}
            single = cost.get(nodes_axis[0])
            cells = [
                "-" if nodes not in cost else f"{cost[nodes] * 1000:.1f}" if nodes == nodes_axis[0] or single is None
                else f"{cost[nodes] / single:.2f}x"
                for nodes in nodes_axis
            ]
            table.add_row(str(rows), *cells)
        console.print(table)
    prefills = Table(title=f"{profile.name}: prefill (processor, vision encoder, prompt)", title_justify="left")
    for column in ("image", "tokens", "seconds"):
        prefills.add_column(column, justify="right")
    for p in profile.prefills:
        prefills.add_row(f"{p.image_side}x{p.image_side}", str(p.tokens), f"{p.seconds:.3f}")
    console.print(prefills)
    host = profile.host
    console.print(
        f"host work of a step: {host.per_step * 1000:.3f} ms + per row {host.per_row * 1000:.3f} ms"
        f" + per row and node {host.per_node * 1000:.4f} ms"
    )
    if profile.issue_s:
        console.print(f"an eager forward's issue on the host: {profile.issue_s * 1000:.2f} ms (overlapping the device's work)")


def profile(
    model: Annotated[str | None, typer.Option(help="Model id, local directory or replay model name (as hsd convert takes) to measure.")] = None,
    random_weights: Annotated[
        str | None,
        typer.Option(help="Measure a real-size architecture with random weights instead: a name in configs/architectures (qwen2_5_vl_3b, qwen2_5_vl_7b, qwen3_5_4b: Chandra 2's shapes) or a config.json."),
    ] = None,
    analytic: Annotated[
        str | None, typer.Option(help=f"Compute the profile for a device not present, from its published figures: {', '.join(DEVICES)}; or {THIS_CPU}, from what this CPU measures (to check the formulas here).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or mps (default: what is present).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: as hsd convert; random weights: float32).")] = None,
    rows: Annotated[str, typer.Option(help="Batch rows to measure, comma-separated.")] = ",".join(map(str, ROWS)),
    nodes: Annotated[str, typer.Option(help="Tree nodes per row to measure, comma-separated.")] = ",".join(map(str, NODES)),
    max_tokens: Annotated[
        int, typer.Option(help="Measure no forward of more than this many rows x nodes (larger shapes are priced along the grid's last segments).")
    ] = MAX_TOKENS,
    contexts: Annotated[str, typer.Option(help="Context lengths (cached tokens) to measure, comma-separated.")] = ",".join(map(str, CONTEXTS)),
    image_sides: Annotated[str, typer.Option(help="Square page pictures (pixels a side) whose prefill is measured.")] = ",".join(map(str, IMAGE_SIDES)),
    host_rows: Annotated[
        str, typer.Option(help="Batch rows at which the decoding loop's host work per step is measured, comma-separated: at least two, or '' to price none.")
    ] = ",".join(map(str, HOST_ROWS)),
    repeats: Annotated[int, typer.Option(help="Runs per measurement; the fastest counts.")] = 2,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the profile as one JSON object on stdout.")] = False,
) -> None:
    """Measure what a decoding step of a model costs on this device (forwards by batch rows x tree
    nodes x context, the host work around them, and prefills by picture size), or compute it for a
    device not present; store it in the user cache."""
    if (model is None) == (random_weights is None):
        raise typer.BadParameter("give one of --model and --random-weights")
    if analytic is not None and analytic not in (*DEVICES, THIS_CPU):
        raise typer.BadParameter(f"unknown device {analytic!r}; known: {', '.join((*DEVICES, THIS_CPU))}", param_hint="--analytic")
    from hsd_cli.models.tiny import architecture_config

    if analytic:
        try:
            if random_weights:
                config, name = architecture_config(random_weights), Path(random_weights).stem
            else:
                config, name = json.loads((Path(model) / "config.json").read_text()), Path(model).name
            from hsd_cli.profiles.issue import measure_issue

            result = analytic_profile(analytic, name, config, measure_issue(config))
        except (OSError, ValueError) as exc:  # no such architecture or config.json; a config the formulas do not price
            raise typer.BadParameter(str(exc), param_hint="--random-weights" if random_weights else "--model") from None
    else:
        grid = {"rows": _ints(rows, "--rows"), "nodes": _ints(nodes, "--nodes"), "contexts": _ints(contexts, "--contexts"),
                "image_sides": _ints(image_sides, "--image-sides"),
                # Two row counts at least: a step's part and a row's part of the host work.
                "host_rows": _ints(host_rows, "--host-rows", least=2, or_none=True)}
        smallest = min(grid["rows"]) * min(grid["nodes"])
        if smallest > max_tokens:
            raise typer.BadParameter(f"{max_tokens} is below the smallest rows x nodes, {smallest}", param_hint="--max-tokens")
        import torch

        if threads:
            torch.set_num_threads(threads)
        if random_weights:
            from hsd_cli.models.tiny import random_target

            target = random_target(random_weights, device=device, dtype=dtype or "float32")
            source = f"random:{Path(random_weights).stem}"
        else:
            from hsd_cli.decoding import load_target

            try:
                target = load_target(model, device=device, dtype=dtype)
            except (OSError, ValueError) as exc:  # not a model directory, not in the HF cache, ...
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"error: cannot load model {model!r}: {first_line}", file=sys.stderr)
                raise typer.Exit(4) from None
            source = model
        result = measure_profile(
            target, source, **grid, max_tokens=max_tokens, repeats=repeats, progress=lambda line: print(line, file=sys.stderr),
        )
    path = save_profile(result)
    print_profile(result)
    print(f"stored as {result.name}: {path}", file=sys.stderr)
    if json_output:
        print(json.dumps(result.to_json()))
