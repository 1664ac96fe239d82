"""`hsd bench kv-traffic`: the bytes a decoding step's KV cache allocates and writes, transformers'
DynamicCache as hsd edits it against the in-place KVStore (the counting: kv_counting.py, imported
when the command runs, so that importing the benches' CLI loads no torch)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer


def kv_traffic(
    rows: Annotated[str, typer.Option(help="Batch rows, comma-separated.")] = "1,8,32",
    contexts: Annotated[str, typer.Option(help="Tokens each row holds, comma-separated.")] = "3000,6000",
    nodes: Annotated[int, typer.Option(help="Tree nodes a row verifies per step (4 are kept).")] = 16,
    json_out: Annotated[str | None, typer.Option(help="Also write the figures to this JSON file.")] = None,
) -> None:
    """Bytes a step's KV cache allocates and writes with Qwen2.5-VL-7B's KV shape: transformers'
    DynamicCache as hsd edits it against the in-place KVStore."""
    from hsd_cli.bench.kv_counting import QWEN25_VL_7B, measure

    shape = QWEN25_VL_7B
    figures = []
    typer.echo(f"KV shape: {shape.layers} layers x {shape.kv_heads} kv heads x {shape.head_dim} dims, "
               f"{shape.dtype}: {shape.bytes_per_token} bytes a token; {nodes} nodes a row a step, 4 kept")
    typer.echo(f"{'cache':<8}{'rows':>5}{'context':>9}{'1st step MB':>13}{'alloc MB/step':>15}{'written MB/step':>17}"
               f"{'leave MB':>10}{'join MB':>10}")
    for row_count in (int(r) for r in rows.split(",")):
        for context in (int(c) for c in contexts.split(",")):
            for store in (False, True):
                traffic = measure(shape, row_count, context, store=store, nodes=nodes)
                figures.append({"cache": "store" if store else "dynamic", **asdict(traffic)})
                typer.echo(
                    f"{'store' if store else 'dynamic':<8}{row_count:>5}{context:>9}{traffic.first_step_written / 1e6:>13.1f}"
                    f"{traffic.step_allocated / 1e6:>15.1f}"
                    f"{traffic.step_written / 1e6:>17.1f}{traffic.leave_written / 1e6:>10.1f}{traffic.join_written / 1e6:>10.1f}"
                )
    if json_out:
        with open(json_out, "w", encoding="utf-8") as out:
            json.dump({"shape": {**asdict(shape), "dtype": str(shape.dtype)}, "nodes": nodes, "figures": figures}, out, indent=1)
