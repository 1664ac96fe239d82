"""`hsd profile`: measured cost grids stored and read back, analytic profiles from a model's
shapes (checked against the parameter counts transformers builds), and clear usage errors."""

import json

import pytest
import torch

from hsd_cli.models.tiny import architecture_config
from hsd_cli.models.tiny_families import build_tiny_random
from hsd_cli.profiles import DEVICES, ModelShape, analytic_forward_s, analytic_profile, load_profile
from tests.conftest import run_hsd


@pytest.mark.parametrize("architecture", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_the_analytic_shapes_count_the_parameters_transformers_builds(architecture):
    from transformers import AutoConfig, AutoModelForImageTextToText

    settings = architecture_config(architecture)
    shape = ModelShape.of(settings)
    family = settings.pop("model_type")
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
    profile = analytic_profile("h100-bf16", "qwen2_5_vl_7b", architecture_config("qwen2_5_vl_7b"))
    assert profile.forward_s(1, 64, 2048) == pytest.approx(analytic_forward_s(shape, h100, 1, 64, 2048))
    between = profile.forward_s(8, 40, 2048)  # interpolated between the grid's 16 and 64 nodes
    assert profile.forward_s(8, 16, 2048) < between < profile.forward_s(8, 64, 2048)


def test_a_measured_profile_is_stored_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = build_tiny_random("qwen2_5_vl", tmp_path / "tiny")
    grid = ["--rows", "1,2", "--nodes", "1,8", "--contexts", "64,128", "--image-sides", "56,112", "--repeats", "1"]
    result = run_hsd("profile", "--model", model, "--dtype", "float32", *grid, "--json")
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    stored = list((tmp_path / "cache" / "hsd" / "profiles").glob("*.json"))
    assert [path.stem for path in stored] == [printed["name"]] and printed["kind"] == "measured"
    profile = load_profile(printed["name"])
    assert json.loads(json.dumps(profile.to_json())) == printed
    assert sorted({(f.rows, f.nodes) for f in profile.forwards}) == [(1, 1), (1, 8), (2, 1), (2, 8)]
    contexts = sorted({f.context for f in profile.forwards})
    assert len(contexts) == 2 and 48 <= contexts[0] < contexts[1], "prompts of about the asked length"
    assert all(f.seconds > 0 for f in profile.forwards)
    assert [p.image_side for p in profile.prefills] == [56, 112] and profile.prefills[0].tokens < profile.prefills[1].tokens


def test_profile_usage_errors(tmp_path):
    assert run_hsd("profile").exit_code == 2, "a model or an architecture is needed"
    unknown = run_hsd("profile", "--random-weights", "qwen2_5_vl_7b", "--analytic", "tpu-v9")
    assert unknown.exit_code == 2 and "unknown device 'tpu-v9'" in unknown.stderr
