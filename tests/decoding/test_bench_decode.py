"""`hsd bench decode` end to end on a tiny model (speed is not asserted here: that is the bench's job)."""

import json

import pytest
from typer.testing import CliRunner

from hsd_cli.bench import bench_app


def test_bench_decode_json_has_every_arm_and_exact_outputs():
    args = ["decode", "--tiny-random", "qwen2_5_vl", "--prompts", "1", "--max-new-tokens", "40", "--json"]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # exactly one JSON object on stdout
    assert set(report["arms"]) == {"ar", "hsd", "ar_anchor", "pld_anchor", "hsd_anchor"}
    for name, arm in report["arms"].items():
        assert arm["new_tokens"] == 40
        assert set(arm) >= {"decode_s", "forwards", "new_tokens", "tau", "identical_to_ar"}
        if name not in ("ar", "ar_anchor"):
            assert arm["identical_to_ar"] is True
    assert report["arms"]["hsd"]["forwards"] < report["arms"]["ar"]["forwards"]


@pytest.mark.slow
def test_bench_decode_of_a_hybrid_model_has_every_arm_transformers_runs_and_exact_outputs():
    args = ["decode", "--tiny-random", "qwen3_5", "--prompts", "1", "--max-new-tokens", "40", "--json"]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["arms"]) == {"ar", "hsd", "ar_anchor", "hsd_anchor"}, "no prompt lookup: the model is stateful"
    assert report["arms"]["hsd"]["identical_to_ar"] is True and report["arms"]["hsd_anchor"]["identical_to_ar"] is True
    assert report["arms"]["hsd"]["forwards"] < report["arms"]["ar"]["forwards"]


def test_bench_decode_sampling_arms_match_plain_sampling():
    args = ["decode", "--tiny-random", "qwen2_5_vl", "--prompts", "1", "--max-new-tokens", "40",
            "--arms", "ar,hsd", "--temperature", "0.9", "--top-p", "0.95", "--json"]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["arms"]["hsd"]["identical_to_ar"] is True


def test_bench_decode_with_given_draft_texts(tmp_path):
    drafts = tmp_path / "drafts.json"
    drafts.write_text(json.dumps(["The quick brown fox jumps over the lazy dog."]))
    args = ["decode", "--tiny-random", "qwen2_5_vl", "--prompts", "1", "--max-new-tokens", "30",
            "--arms", "ar,hsd", "--drafts", str(drafts), "--json"]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["arms"]["hsd"]["identical_to_ar"] is True and report["draft_noise"] is None


def test_the_generate_baseline_is_plain_greedy_whatever_the_checkpoint_sets(tmp_path):
    import pymupdf

    from hsd_cli.bench.decode import run_generate
    from hsd_cli.decoding import DecodeConfig, SamplingConfig, decode
    from hsd_cli.decoding.hf_target import load_target
    from hsd_cli.models.tiny_families import build_tiny_random

    target = load_target(str(build_tiny_random("qwen2_5_vl", tmp_path / "tiny")), device="cpu", dtype="float32")
    image = pymupdf.open().new_page().get_pixmap().pil_image()
    plain = decode(target, image, "Read this.", [], DecodeConfig(max_new_tokens=40)).tokens
    assert run_generate(target, image, "Read this.", 40, SamplingConfig()).tokens == plain
    # Qwen checkpoints ship a repetition penalty; generate applies it even without sampling.
    target.model.generation_config.repetition_penalty = 1.05
    target.model.generation_config.no_repeat_ngram_size = 2
    shaped = target.model.generate(**target.inputs([image], ["Read this."]), max_new_tokens=40, do_sample=False)
    assert shaped[0, -40:].tolist() != plain, "the checkpoint's settings change generate's output"
    assert run_generate(target, image, "Read this.", 40, SamplingConfig()).tokens == plain


def test_an_unknown_tiny_family_is_a_one_line_usage_error():
    result = CliRunner().invoke(bench_app, ["decode", "--tiny-random", "no_such_family"])
    assert result.exit_code == 2 and "no tiny random model of 'no_such_family'" in result.output
    assert "Traceback" not in result.output
