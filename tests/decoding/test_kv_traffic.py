"""The bytes a step's KV cache writes (hsd_cli/bench/kv_traffic.py), counted per aten op on the
meta device with Qwen2.5-VL-7B's KV shape: with the in-place store they follow the tokens a step
adds, with the DynamicCache path the context."""

import json

import pytest
import torch
from typer.testing import CliRunner

from hsd_cli.bench.kv_counting import QWEN25_VL_7B, TrafficCounter, measure
from hsd_cli.bench.kv_traffic import kv_traffic

NODES = 16  # tree nodes a row verifies a step in `measure`


def test_the_counter_counts_new_tensors_and_in_place_writes_not_views():
    cache = torch.zeros((2, 4, 10, 8), device="meta")
    new = torch.zeros((2, 4, 3, 8), device="meta")
    with TrafficCounter() as counter:
        grown = torch.cat([cache, new], dim=2)
        grown[:, :, :5].transpose(1, 2)  # views
    assert counter.allocated == counter.written == grown.numel() * 4
    index = torch.zeros((2, 4, 3, 8), dtype=torch.long, device="meta")
    with TrafficCounter() as counter:
        cache.scatter_(2, index, new)
        cache.index_copy_(0, torch.tensor([1], device="meta"), cache[:1])
        cache[:, :, :3] = new
    assert counter.allocated == 0 and counter.written == new.numel() * 4 + cache[:1].numel() * 4 + new.numel() * 4
    with TrafficCounter() as counter:
        torch.zeros((2, 3), device="meta").add(1)  # two new tensors of 6 floats
        torch.zeros(5, dtype=torch.long, device="meta") + 1  # index bookkeeping: not counted
        torch.zeros(5) + 1  # another device: not counted
    assert counter.written == 2 * 2 * 3 * 4


@pytest.mark.parametrize("rows", [8, 32])
def test_a_steps_bytes_follow_the_tokens_it_adds_with_the_store_and_the_context_without(rows):
    store = {context: measure(QWEN25_VL_7B, rows, context, store=True, nodes=NODES) for context in (3000, 6000)}
    dynamic = {context: measure(QWEN25_VL_7B, rows, context, store=False, nodes=NODES) for context in (3000, 6000)}
    assert abs(store[6000].step_written / store[3000].step_written - 1) < 0.10
    added = rows * NODES * QWEN25_VL_7B.bytes_per_token
    assert added <= store[3000].step_written < 1.5 * added, "the nodes written, and kept paths moved"
    assert store[3000].step_allocated < 0.2 * added
    # The same counter sees the context where a step copies the cache.
    assert dynamic[6000].step_written > 1.8 * dynamic[3000].step_written > 1.8 * 30 * store[3000].step_written
    # A row leaving moves at most one row (read, then written); a row joining (prefilled alone)
    # has its entries copied once; the DynamicCache path copies every row's.
    for context in (3000, 6000):
        one_row = context * QWEN25_VL_7B.bytes_per_token
        assert store[context].leave_written <= 2 * one_row < dynamic[context].leave_written
        assert store[context].join_written == one_row and dynamic[context].join_written > rows * one_row
        assert store[context].first_step_written == pytest.approx(store[context].step_written, rel=0.01), "no reallocation after the prefill"


def test_the_bench_command_prints_and_writes_both_caches(tmp_path):
    from hsd_cli.bench import bench_app

    out = tmp_path / "traffic.json"
    result = CliRunner().invoke(bench_app, ["kv-traffic", "--rows", "2", "--contexts", "200", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    assert "57344 bytes a token" in result.output
    figures = json.loads(out.read_text())["figures"]
    assert [f["cache"] for f in figures] == ["dynamic", "store"] and figures[1]["step_written"] < figures[0]["step_written"]
    attention = json.loads(out.read_text())["attention"]
    assert [a["attention"] for a in attention] == ["sdpa", "hsd"] and attention[1]["moved"] < attention[0]["moved"]


@pytest.mark.parametrize("rows", [8, 32])
def test_folded_attention_reads_the_cache_once_where_sdpa_copies_it_per_query_head(rows):
    from hsd_cli.bench.kv_counting import attention_traffic

    groups = 28 // QWEN25_VL_7B.kv_heads
    for context in (3000, 6000):
        cache = rows * (context + NODES) * QWEN25_VL_7B.bytes_per_token  # keys and values, every layer
        repeated = attention_traffic(QWEN25_VL_7B, rows, context, folded=False, nodes=NODES)
        folded = attention_traffic(QWEN25_VL_7B, rows, context, folded=True, nodes=NODES)
        assert repeated.copied >= groups * cache and repeated.kernel_read >= groups * cache
        assert cache <= folded.kernel_read < 1.2 * cache, "the cache read once, the repeated mask small beside it"
        assert folded.copied < 0.2 * cache and folded.moved < repeated.moved / 10
