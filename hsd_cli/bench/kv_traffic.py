"""`hsd bench kv-traffic`: the bytes a decoding step's KV cache allocates and writes, transformers'
DynamicCache as hsd edits it against the in-place KVStore; and the bytes a tree forward's
attention moves, transformers' SDPA (keys and values repeated over the query heads) against
hsd's (head groups folded into the query length). The counting: kv_counting.py, imported when the
command runs, so that importing the benches' CLI loads no torch."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

QUERY_HEADS = 28  # Qwen2.5-VL-7B's, over its 4 key-value heads


def kv_traffic(
    rows: Annotated[str, typer.Option(help="Batch rows, comma-separated.")] = "1,8,32",
    contexts: Annotated[str, typer.Option(help="Tokens each row holds, comma-separated.")] = "3000,6000",
    nodes: Annotated[int, typer.Option(help="Tree nodes a row verifies per step (4 are kept).")] = 16,
    json_out: Annotated[str | None, typer.Option(help="Also write the figures to this JSON file.")] = None,
) -> None:
    """Bytes a step's KV cache allocates and writes with Qwen2.5-VL-7B's KV shape (transformers'
    DynamicCache as hsd edits it against the in-place KVStore), and bytes its attention moves
    (transformers' SDPA against hsd's folded head groups)."""
    from hsd_cli.bench.kv_counting import QWEN25_VL_7B, attention_traffic, measure

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
    attention = []
    typer.echo(f"A tree forward's attention, {QUERY_HEADS} query heads over {shape.kv_heads}, as a fused kernel moves it: "
               "sdpa (transformers', keys and values repeated) against hsd (head groups folded)")
    typer.echo(f"{'attention':<10}{'rows':>5}{'context':>9}{'copied GB':>11}{'kernel read GB':>16}{'moved GB':>10}")
    for row_count in (int(r) for r in rows.split(",")):
        for context in (int(c) for c in contexts.split(",")):
            for folded in (False, True):
                moved = attention_traffic(shape, row_count, context, folded=folded, nodes=nodes, query_heads=QUERY_HEADS)
                attention.append({"attention": "hsd" if folded else "sdpa", **asdict(moved), "moved": moved.moved})
                typer.echo(
                    f"{'hsd' if folded else 'sdpa':<10}{row_count:>5}{context:>9}{moved.copied / 1e9:>11.2f}"
                    f"{moved.kernel_read / 1e9:>16.2f}{moved.moved / 1e9:>10.2f}"
                )
    if json_out:
        with open(json_out, "w", encoding="utf-8") as out:
            json.dump({
                "shape": {**asdict(shape), "dtype": str(shape.dtype)}, "nodes": nodes, "figures": figures,
                "query_heads": QUERY_HEADS, "attention": attention,
            }, out, indent=1)
