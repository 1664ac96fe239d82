"""`hsd bench decode` end to end on a tiny model (speed is not asserted here: that is the bench's job)."""

import json

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
