"""Cost profiles: one pricing of a decoding step (forward plus host work) and a prefill, past the
grid too, for profiles stored with older grids as well; `hsd profile`: measured cost grids stored
and read back, analytic profiles from a model's shapes (checked against the parameter counts
transformers builds), and clear usage errors."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hsd_cli.decoding.sizing import LoadSizer
from hsd_cli.decoding.tree import TokenTree
from hsd_cli.models.tiny import architecture_config
from hsd_cli.models.tiny_families import build_tiny_random
from hsd_cli.profiles import ForwardCost, HostCost, PrefillCost, Profile, load_profile, square_side
from hsd_cli.profiles.analytic import DEVICES, ModelShape, analytic_forward_s, analytic_prefill_s, analytic_profile
from hsd_cli.decoding.layer_mix import LinearAttention
from hsd_cli.profiles.issue import IssueCost, measure_issue
from hsd_cli.profiles.measured import fit_host
from tests.conftest import run_hsd


ARCHITECTURES = Path(__file__).resolve().parents[1] / "configs" / "architectures"
HYBRID, ATTENTION_TWIN = (str(ARCHITECTURES / f"qwen3_5_shaped_1024x24{suffix}.json") for suffix in ("", "_attention"))
CHANDRA_2 = str(ARCHITECTURES / "qwen3_5_4b.json")
ISSUE = IssueCost(dispatch_s=0.010, kernels=1000)  # 12.5 ms to issue an eager forward


@pytest.mark.parametrize(
    "architecture", ["qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen3_5_shaped_1024x24", "qwen3_5_shaped_1024x24_attention", "qwen3_5_4b"],
)
def test_the_analytic_shapes_count_the_parameters_transformers_builds(architecture):
    from transformers import AutoConfig, AutoModelForImageTextToText

    settings = architecture_config(str(ARCHITECTURES / f"{architecture}.json"))  # this checkout's, not the installed package's
    shape = ModelShape.of(settings)
    family = settings.pop("model_type")
    settings.pop("_comment", None)
    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(family, **settings))
    counts = {"visual": 0, "text": 0}
    for name, parameter in model.named_parameters():
        counts["visual" if "visual" in name else "text"] += parameter.numel()
    assert shape.text_params == pytest.approx(counts["text"], rel=0.005)
    assert shape.vision_params == pytest.approx(counts["visual"], rel=0.005)


def test_on_a_gpu_a_7b_forward_verifies_64_nodes_for_about_the_cost_of_one():
    shape, h100 = ModelShape.of(architecture_config("qwen2_5_vl_7b")), DEVICES["h100-bf16"]
    one = analytic_forward_s(shape, h100, rows=1, nodes=1, context=2048)
    assert analytic_forward_s(shape, h100, rows=1, nodes=64, context=2048) < 1.05 * one, "memory-bound: weights read once"
    assert analytic_forward_s(shape, h100, rows=8, nodes=64, context=2048) > 1.5 * one, "512 tokens: compute shows"
    assert analytic_forward_s(shape, h100, rows=1, nodes=1, context=32768) > one, "a long cache costs reads"
    profile = analytic_profile("h100-bf16", "qwen2_5_vl_7b", architecture_config("qwen2_5_vl_7b"), ISSUE)
    assert profile.forward_s(1, 64, 2048) == pytest.approx(analytic_forward_s(shape, h100, 1, 64, 2048))
    between = profile.forward_s(8, 40, 2048)  # interpolated between the grid's 32 and 64 nodes
    assert profile.forward_s(8, 32, 2048) < between < profile.forward_s(8, 64, 2048)


def test_an_eager_step_on_a_gpu_takes_the_longer_of_the_devices_work_and_the_hosts_issue():
    profile = analytic_profile("h100-bf16", "qwen2_5_vl_7b", architecture_config("qwen2_5_vl_7b"), ISSUE)
    assert profile.issue_s == pytest.approx(ISSUE.seconds) == pytest.approx(0.0125)
    small, large = profile.forward_s(1, 1, 2048), profile.forward_s(256, 4, 2048)
    assert small < profile.issue_s < large, "one row's device work is shorter than the issue, 256 rows' longer"
    assert profile.step_s(1, 1, 2048) == pytest.approx(profile.issue_s + profile.host.seconds(1, 1))
    assert profile.step_s(256, 4, 2048) == pytest.approx(large + profile.host.seconds(256, 4))


def test_a_deeper_model_takes_longer_to_issue_and_launches_more_kernels():
    shallow, deep = ({"model_type": "qwen2_5_vl", "text_config": {"num_hidden_layers": layers}} for layers in (2, 8))
    issued = [measure_issue(config, repeats=5) for config in (shallow, deep)]
    assert issued[1].kernels > 3 * issued[0].kernels > 0
    assert issued[1].dispatch_s > 2 * issued[0].dispatch_s > 0
    with pytest.raises(ValueError, match="no tiny recipe"):
        measure_issue({"model_type": "llama", "num_hidden_layers": 2})


def test_an_analytic_profile_stored_before_the_issue_time_was_measured_is_refused():
    data = analytic_profile("h100-bf16", "qwen2_5_vl_7b", architecture_config("qwen2_5_vl_7b"), ISSUE).to_json()
    del data["issue_s"]
    with pytest.raises(ValueError, match="compute it again"):
        Profile.from_json(data)
    assert Profile.from_json(json.loads(json.dumps(data | {"kind": "measured"}))).issue_s == 0.0


def test_a_linear_attention_layer_is_priced_by_its_fixed_state_and_its_work_per_node_not_as_attention():
    """The hybrid (3 Gated DeltaNet layers to 1 attention layer) against its attention-only twin:
    a quarter of the keys and values, a fixed state per row instead, and no attention over the
    context in its linear layers; over a tree, the linear layers' pairwise work grows with the
    square of the nodes."""
    hybrid, twin, h100 = ModelShape.of(architecture_config(HYBRID)), ModelShape.of(architecture_config(ATTENTION_TWIN)), DEVICES["h100-bf16"]
    assert hybrid.attention_layers == 6 and twin.attention_layers == 24 and twin.linear is None
    assert hybrid.kv_bytes_per_token * 4 == twin.kv_bytes_per_token
    linear = hybrid.linear
    assert (linear.layers, linear.heads, linear.conv_channels) == (18, 16, 3 * 16 * 128)
    # 16 heads of 128 x 128 in fp32 and a 4-input conv window of 6,144 channels in bf16, per linear layer.
    assert hybrid.state_bytes_per_row(2) == 18 * (16 * 128 * 128 * 4 + 6144 * 4 * 2)
    # Many rows at a long context: the twin reads four times the keys and values.
    assert analytic_forward_s(hybrid, h100, 256, 1, 8192) < 0.5 * analytic_forward_s(twin, h100, 256, 1, 8192)
    assert linear.tree_flops(64) - 64 * linear.tree_flops(1) > 60 * 64 * linear.layers * linear.heads * (5 * 128 + 3 * 128)
    memory = analytic_profile("h100-bf16", "hybrid", architecture_config(HYBRID), ISSUE).memory
    assert memory.state_bytes_per_row == hybrid.state_bytes_per_row(2)
    assert memory.row_bytes(1000) == 1000 * hybrid.kv_bytes_per_token * 2 + memory.state_bytes_per_row


def test_hsd_profile_computes_chandra_2s_analytic_profile(tmp_path, monkeypatch):
    """Chandra 2's shapes (Qwen3.5-4B: 24 linear and 8 attention layers) on an H100, stored and
    read back with its fixed state per row."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stored = run_hsd("profile", "--analytic", "h100-bf16", "--random-weights", CHANDRA_2)
    assert stored.exit_code == 0, stored.stderr
    profile, shape = load_profile("qwen3_5_4b-h100-bf16"), ModelShape.of(architecture_config(CHANDRA_2))
    assert 4.4e9 < shape.text_params + shape.vision_params < 4.7e9, "a 4B model"
    assert (shape.linear.layers, shape.attention_layers) == (24, 8)
    assert profile.memory.state_bytes_per_row == shape.state_bytes_per_row(2) > 0
    assert profile.forward_s(1, 64, 4096) < 1.05 * profile.forward_s(1, 1, 4096), "one row is memory-bound"


def test_the_linear_layers_tree_flops_are_the_tree_forms_own():
    """`LinearAttention.tree_flops` against the matrix products delta_tree.py runs (counted by
    torch) and its two triangular solves (nodes^2 per column, which torch does not count)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hsd_cli.decoding.hf_target.delta_tree import tree_gated_delta_rule
    from hsd_cli.decoding.tree import tree_layout

    parents, heads, key_heads, key_dim, value_dim = (-1, 0, 0, 1, 1, 2, 5, 6, 6, 3, 9, 9), 4, 2, 8, 5
    nodes = len(parents)
    ancestors = torch.from_numpy(tree_layout(parents).ancestors)[None]
    query, key = torch.randn(1, nodes, key_heads, key_dim), torch.randn(1, nodes, key_heads, key_dim)
    with FlopCounterMode(display=False) as counted:
        tree_gated_delta_rule(query, key, torch.randn(1, nodes, heads, value_dim), -torch.rand(1, nodes, heads),
                              torch.rand(1, nodes, heads), ancestors, torch.randn(1, heads, key_dim, value_dim))
    solves = heads * nodes**2 * (key_dim + value_dim)
    no_conv = LinearAttention(layers=1, heads=heads, key_dim=key_dim, value_dim=value_dim, conv_channels=0, kernel=4)
    assert no_conv.tree_flops(nodes) == counted.get_total_flops() + solves


def test_a_measured_profile_is_stored_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = build_tiny_random("qwen2_5_vl", tmp_path / "tiny")
    grid = ["--rows", "1,2,4", "--nodes", "1,8", "--max-tokens", "16", "--contexts", "64,128", "--image-sides", "56,112",
            "--host-rows", "1,2", "--repeats", "1"]
    result = run_hsd("profile", "--model", model, "--dtype", "float32", *grid, "--json")
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    stored = list((tmp_path / "cache" / "hsd" / "profiles").glob("*.json"))
    assert [path.stem for path in stored] == [printed["name"]] and printed["kind"] == "measured"
    profile = load_profile(printed["name"])
    assert json.loads(json.dumps(profile.to_json())) == printed
    assert sorted({(f.rows, f.nodes) for f in profile.forwards}) == [(1, 1), (1, 8), (2, 1), (2, 8), (4, 1)], "up to 16 tokens"
    contexts = sorted({f.context for f in profile.forwards})
    assert len(contexts) == 2 and 48 <= contexts[0] < contexts[1], "prompts of about the asked length"
    assert all(f.seconds > 0 for f in profile.forwards)
    assert [p.image_side for p in profile.prefills] == [56, 112] and profile.prefills[0].tokens < profile.prefills[1].tokens
    host = profile.host
    assert min(host.per_step, host.per_row, host.per_node) >= 0 and host.seconds(1, 1) > 0, "the loop's host work, measured"


def test_profile_usage_errors(tmp_path):
    assert run_hsd("profile").exit_code == 2, "a model or an architecture is needed"
    unknown = run_hsd("profile", "--random-weights", "qwen2_5_vl_7b", "--analytic", "tpu-v9")
    assert unknown.exit_code == 2 and "unknown device 'tpu-v9'" in unknown.stderr
    # Checked before any model loads.
    not_numbers = run_hsd("profile", "--model", str(tmp_path / "absent"), "--rows", "1,four")
    assert not_numbers.exit_code == 2 and "comma-separated whole numbers, not '1,four'" in not_numbers.stderr
    one_host_row = run_hsd("profile", "--model", str(tmp_path / "absent"), "--host-rows", "8")
    assert one_host_row.exit_code == 2 and "at least 2 distinct values or none, not '8'" in one_host_row.stderr
    nothing_fits = run_hsd("profile", "--model", str(tmp_path / "absent"), "--rows", "2,4", "--nodes", "2", "--max-tokens", "3")
    assert nothing_fits.exit_code == 2 and "3 is below the smallest rows x nodes, 4" in nothing_fits.stderr
    # A model that cannot be loaded: one line and exit code 4, as hsd convert says it.
    not_a_model = run_hsd("profile", "--model", str(tmp_path), "--rows", "1", "--nodes", "1")
    assert not_a_model.exit_code == 4 and not_a_model.stderr.startswith(f"error: cannot load model '{tmp_path}'")
    assert len(not_a_model.stderr.strip().splitlines()) == 1 and "Traceback" not in not_a_model.stderr
    # Analytic: no such architecture, and a mixture of experts the formulas do not price.
    absent = run_hsd("profile", "--analytic", "h100-bf16", "--random-weights", "qwen9_vl_1t")
    assert absent.exit_code == 2 and "no architecture 'qwen9_vl_1t'" in absent.stderr
    experts = architecture_config(HYBRID)
    experts["text_config"].update(num_experts=4, moe_intermediate_size=64)
    (tmp_path / "moe.json").write_text(json.dumps(experts))
    moe = run_hsd("profile", "--analytic", "h100-bf16", "--random-weights", str(tmp_path / "moe.json"))
    said = " ".join(moe.stderr.replace("│", " ").split())  # the error box wraps its lines
    assert moe.exit_code == 2 and "text model is a mixture of experts" in said and "Traceback" not in moe.stderr


NO_HOST = HostCost()


def hand_made(seconds, rows=(1, 4, 8), nodes=(1, 16, 64), contexts=(512, 2048), host=NO_HOST) -> Profile:
    """A profile whose forward costs `seconds(rows, nodes, context)` on the grid; prefills of 448 and
    1344 pixels a side cost 0.1 and 0.5 s (300 and 2,300 tokens)."""
    forwards = tuple(ForwardCost(r, n, c, seconds(r, n, c)) for c in contexts for r in rows for n in nodes)
    prefills = (PrefillCost(448, 300, 0.1), PrefillCost(1344, 2300, 0.5))
    return Profile("hand-made", "test", "cpu", "float32", "measured", forwards, prefills, host)


def test_past_the_grid_a_price_goes_on_along_the_last_segment_and_never_falls():
    def linear(rows, nodes, context):
        return 0.01 + 0.001 * rows * nodes + 1e-6 * rows * context

    profile = hand_made(linear)
    for shape in ((1, 16, 512), (6, 40, 1000), (64, 64, 2048), (256, 2, 2048), (8, 64, 8192)):
        assert profile.forward_s(*shape) == pytest.approx(linear(*shape)), "bilinear within one cell, linear past the grid"
    # Measured noise can make the last segment fall: past the grid the price stays at its last point.
    dipping = hand_made(lambda rows, nodes, context: 0.05 if (rows, nodes) == (8, 64) else 0.02 + 0.001 * rows * nodes)
    assert dipping.forward_s(64, 64, 2048) == pytest.approx(dipping.forward_s(8, 64, 2048))
    assert dipping.forward_s(8, 200, 2048) == pytest.approx(0.05)
    assert profile.forward_s(1, 1, 100) == profile.forward_s(1, 1, 512), "before the grid: its first point"


def test_a_grid_without_its_largest_shapes_prices_them_along_its_edges():
    """A measured grid may stop short of many rows x many nodes (`--max-tokens`)."""
    def linear(rows, nodes, context):
        return 0.01 + 0.001 * rows * nodes

    full = hand_made(linear, rows=(1, 8, 64), nodes=(1, 8, 64))
    staircase = replace(full, forwards=tuple(f for f in full.forwards if f.rows * f.nodes <= 512))
    assert len(staircase.forwards) < len(full.forwards)
    assert staircase.forward_s(64, 8, 2048) == pytest.approx(full.forward_s(64, 8, 2048)), "measured"
    # 64 rows of 64 nodes: along the 64-row curve's last segment (1 -> 8 nodes).
    assert staircase.forward_s(64, 64, 2048) == pytest.approx(linear(64, 64, 2048))


def test_a_profile_stored_with_the_old_grid_loads_and_prices(tmp_path):
    """Profiles stored before host work was measured and before the grids grew: rows 1, 4, 8;
    nodes 1, 16, 64; pictures up to 1,344 px."""
    old = {
        "name": "old", "model": "m", "device": "cpu", "dtype": "float32", "kind": "measured",
        "forwards": [{"rows": r, "nodes": n, "context": c, "seconds": 0.02 * r * (1 + n / 16) * (1 + c / 4096)}
                     for c in (520, 2056) for r in (1, 4, 8) for n in (1, 16, 64)],
        "prefills": [{"image_side": side, "tokens": tokens, "seconds": seconds}
                     for side, tokens, seconds in ((448, 277, 0.5), (896, 1045, 2.0), (1344, 2344, 4.5))],
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    profile = load_profile(str(tmp_path / "old.json"))
    assert profile.host == HostCost() and profile.step_s(8, 16, 2056) == profile.forward_s(8, 16, 2056) == pytest.approx(0.02 * 8 * 2 * (1 + 2056 / 4096))
    assert profile.forward_s(256, 41, 2056) > 8 * profile.forward_s(8, 41, 2056), "many rows: linear past 8, not flat"
    assert profile.forward_s(8, 16, 5000) > profile.forward_s(8, 16, 2056), "a long page context costs more"
    letter = square_side(1275, 1650)  # a Letter page at 150 dpi
    assert profile.prefill_s(letter) > profile.prefill_s(1344) and profile.prefill_tokens(letter) > 2344
    assert load_profile(str(tmp_path / "old.json")).to_json()["host"] == {"per_step": 0.0, "per_row": 0.0, "per_node": 0.0}
    assert profile.memory is None, "stored before device memory: rows unbounded"


def test_a_prefill_is_priced_by_its_pictures_area():
    profile = hand_made(lambda rows, nodes, context: 0.01)
    assert square_side(1200, 60) == 268, "a line's crop: the area of a 268-pixel square, not a 1,200-pixel one"
    assert profile.prefill_s(square_side(896, 896)) == pytest.approx(0.1 + 0.4 * (896**2 - 448**2) / (1344**2 - 448**2))
    assert profile.prefill_s(100) == 0.1, "before the grid: its first point"
    assert profile.prefill_s(1792) == pytest.approx(0.1 + 0.4 * (1792**2 - 448**2) / (1344**2 - 448**2)), "linear in area past it"
    assert profile.prefill_tokens(1344) == 2300


def test_a_step_is_its_forward_and_the_host_work_around_it():
    host = HostCost(per_step=0.002, per_row=0.0003, per_node=0.00001)
    profile = hand_made(lambda rows, nodes, context: 0.01 * rows, host=host)
    assert host.seconds(64, 4) == pytest.approx(0.002 + 64 * (0.0003 + 4 * 0.00001))
    assert profile.step_s(64, 4, 2048) == pytest.approx(profile.forward_s(64, 4, 2048) + host.seconds(64, 4))
    stored = Profile.from_json(json.loads(json.dumps(profile.to_json())))
    assert stored == profile and stored.step_s(3, 5, 700) == profile.step_s(3, 5, 700)


def test_the_host_work_is_fitted_per_step_row_and_node_and_never_below_zero():
    truth = HostCost(per_step=0.001, per_row=0.0002, per_node=0.00001)
    runs = [(rows, nodes, truth.seconds(rows, nodes)) for rows in (1, 8, 64) for nodes in (1.0, 17.0)]
    fitted = fit_host(runs)
    assert (fitted.per_step, fitted.per_row, fitted.per_node) == pytest.approx((0.001, 0.0002, 0.00001))
    # A step costing less per row on more rows (noise) fits no gain per row.
    noisy = fit_host([(1, 1.0, 0.003), (8, 1.0, 0.0025), (1, 17.0, 0.004), (8, 17.0, 0.0035)])
    assert noisy.per_row == 0.0 and noisy.per_step > 0 and noisy.per_node >= 0


def test_the_load_sizer_prices_a_step_with_the_profile_host_work_included():
    """Host work costs the same at any width, so where it weighs, a wider tree pays sooner."""
    def per_node(rows, nodes, context):
        return 0.001 * rows * nodes  # compute-bound: a draft node costs what a plain row costs

    tree = TokenTree.chain(5, [6, 7, 8, 9], evidence=4)

    def width(profile: Profile) -> int:
        sizer = LoadSizer(profile.step_s)
        for _ in range(20):  # three of its four draft tokens are accepted every time
            sizer.observe("drafts", tree, [0, 1, 2, 3])
        return sizer.width(["drafts"], [tree], [10])

    assert width(hand_made(per_node)) == 1
    assert width(hand_made(per_node, host=HostCost(per_step=0.01))) == 4


def test_analytic_profiles_price_continuous_batching_and_pages_past_1344_pixels():
    config = architecture_config("qwen2_5_vl_7b")
    shape, h100 = ModelShape.of(config), DEVICES["h100-bf16"]
    profile = analytic_profile("h100-bf16", "qwen2_5_vl_7b", config, ISSUE)
    assert {f.rows for f in profile.forwards} >= {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
    assert {f.nodes for f in profile.forwards} == {1, 2, 4, 8, 16, 32, 64}
    assert profile.forward_s(256, 2, 2048) == pytest.approx(analytic_forward_s(shape, h100, 256, 2, 2048))
    assert profile.host.per_step > 0 and profile.step_s(256, 2, 2048) > profile.forward_s(256, 2, 2048)
    assert max(p.image_side for p in profile.prefills) >= 2048, "hsd convert renders pages up to 2,048^2 pixels"
    # The encoder's full-attention layers grow with the square of the patches: past 4x for twice the side.
    assert analytic_prefill_s(shape, h100, 2240)[1] > 4 * analytic_prefill_s(shape, h100, 1120)[1]


@pytest.mark.slow
def test_random_weights_build_a_hybrid_architecture_with_its_text_settings_nested(tmp_path):
    """A Qwen3.5 config.json nests its text settings: the tiny tokenizer's special ids go there."""
    from hsd_cli.models.tiny import random_target

    checkout = Path(__file__).resolve().parents[1]
    settings = architecture_config(str(checkout / "configs" / "architectures" / "qwen3_5_shaped_1024x24.json"))
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                 layer_types=["linear_attention"] * 3 + ["full_attention"], vocab_size=1024)
    settings["text_config"].update(small)
    settings["vision_config"].update(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(settings))
    target = random_target(str(path))
    text = target.model.config.text_config
    assert len(target.linear_layers) == 3 and text.eos_token_id in target.stop_token_ids
    assert text.eos_token_id == target.tokenizer.eos_token_id


def test_the_h200_is_an_h100_with_more_and_faster_memory_and_its_profile_knows_the_rows_it_holds(tmp_path, monkeypatch):
    """The 7B's weights beside 80 or 141 GiB: the rows are the KV budget over a row's cache
    (57,344 bytes a token in bf16, BENCHMARKS "Rows in flight by default on a GPU")."""
    from hsd_cli.serving.rows import device_rows

    config = architecture_config("qwen2_5_vl_7b")
    shape = ModelShape.of(config)
    h100, h200 = DEVICES["h100-bf16"], DEVICES["h200-bf16"]
    assert h200.peak_flops == h100.peak_flops and h200.memory_bandwidth > h100.memory_bandwidth
    assert h200.memory_bytes > h100.memory_bytes
    assert analytic_forward_s(shape, h200, 64, 1, 4096) < analytic_forward_s(shape, h100, 64, 1, 4096), "memory-bound: faster"
    assert analytic_forward_s(shape, h200, 64, 64, 4096) == pytest.approx(analytic_forward_s(shape, h100, 64, 64, 4096), rel=0.05), (
        "compute-bound: the same")
    profile = analytic_profile("h200-bf16", "qwen2_5_vl_7b", config, ISSUE)
    assert profile.name == "qwen2_5_vl_7b-h200-bf16" and profile.memory.kv_bytes_per_token == 57344
    assert 15e9 < profile.memory.weight_bytes < 18e9
    rows = {name: device_rows(memory.device_bytes, memory.weight_bytes, 6991 * memory.kv_bytes_per_token)
            for name, memory in (("h100", analytic_profile("h100-bf16", "7b", config, ISSUE).memory), ("h200", profile.memory))}
    assert 130 <= rows["h100"] <= 145 and rows["h200"] > 1.9 * rows["h100"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stored = run_hsd("profile", "--analytic", "h200-bf16", "--random-weights", "qwen2_5_vl_7b")
    assert stored.exit_code == 0, stored.stderr
    stored_profile = load_profile("qwen2_5_vl_7b-h200-bf16")
    assert stored_profile.issue_s > 0.001, "the issue time measured for the 7B's 28 layers"
    assert stored_profile == replace(profile, issue_s=stored_profile.issue_s), "the memory is stored and read back"
