"""The VLM stages inside `hsd convert`, on a tiny random Qwen2.5-VL built by the test."""

import json

import pytest

from tests import fixtures
from tests.conftest import run_hsd


@pytest.mark.parametrize("stages", ["page", "region-page", "packed"])
def test_vlm_page_output_is_the_answer_and_equals_plain_decoding(stages, tiny_model, docs_dir, tmp_path):
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", tiny_model, "--stages", stages,
        "--pages", "1", "--max-new-tokens", "24", "--baseline", "--json",
    )
    assert result.exit_code == 0, result.stderr
    page = json.loads((tmp_path / "report.json").read_text())["pages"][0]
    assert page["text_source"] == "model" and "vlm" in page["flags"]
    assert page["stats"]["baseline"]["identical"], "speculative output must equal plain decoding"
    assert page["stats"]["page"]["new_tokens"] == 24 and page["stats"]["stop_reason"] == "budget"
    assert "truncated" in page["flags"] and "token budget (24 tokens)" in page["notice"]
    assert f"report.pdf: page 1: {page['notice']}" in result.stderr
    assert ("regions" in page["stats"]) == (stages != "page")
    assert page["blocks"] and all(b["source"] == "pdf-text" for b in page["blocks"]), "drafts stay in the JSON"
    assert (tmp_path / "report.md").read_text().strip() == page["markdown"]
    decoding = json.loads(result.stdout)["decoding"]
    assert decoding["pages"] == 1 and decoding["speedup"]["kind"] == "measured"
    # Packed region passes run in the page stage's forwards, so their seconds are the page's.
    assert (decoding["region_s"] > 0) == (stages == "region-page")
    # The region passes are part of what speculation costs: plain page decoding against both
    # (computed before the seconds are rounded to milliseconds, which on a tiny model's tenths of a
    # second moves the ratio by a percent or two).
    spent = decoding["region_s"] + decoding["page_s"]
    assert decoding["speedup"]["value"] == pytest.approx(decoding["baseline_page_s"] / spent, rel=0.05)


def _invisible_text_pdf(path, text):
    """A page whose picture never changes (a filled box) with `text` as an invisible text layer:
    the text drafts the page without changing what the model sees."""
    import pymupdf

    with pymupdf.open() as doc:
        page = doc.new_page(width=300, height=300)
        page.draw_rect(pymupdf.Rect(40, 220, 260, 280), color=(0, 0, 0), fill=(0.2, 0.4, 0.6))
        page.insert_textbox(pymupdf.Rect(20, 90, 280, 210), text, fontsize=8, render_mode=3)
        doc.save(path)


@pytest.mark.slow
def test_a_page_drafted_with_the_models_own_text_accepts_drafts_and_equals_plain_decoding(tiny_model, tmp_path):
    # A random model never agrees with real text, so its own plain output is the draft: decode
    # the page once, then again with that output as the page's text layer.
    def convert(name, text):
        _invisible_text_pdf(tmp_path / f"{name}.pdf", text)
        result = run_hsd(
            "convert", tmp_path / f"{name}.pdf", "-o", tmp_path / name, "--model", tiny_model, "--stages", "page",
            "--max-new-tokens", "48", "--baseline", "--json",
        )
        assert result.exit_code == 0, result.stderr
        return json.loads((tmp_path / name / f"{name}.json").read_text())["pages"][0]

    first = convert("first", "Placeholder words.")
    second = convert("second", first["markdown"])
    assert second["stats"]["page"]["accepted"] > 10, "the model's own text must be accepted"
    assert second["stats"]["page"]["forwards"] < second["stats"]["baseline"]["forwards"]
    assert second["stats"]["baseline"]["identical"], "speculative output must equal plain decoding"
    assert second["markdown"] == first["markdown"] and second["text_source"] == "model"


@pytest.mark.slow
def test_auto_stages_run_regions_only_for_uncertain_blocks(tiny_model, docs_dir, tmp_path):
    result = run_hsd(
        "convert", docs_dir, "-o", tmp_path, "--model", tiny_model, "--max-new-tokens", "8", "--pages", "1", "--json",
    )
    assert result.exit_code == 0, result.stderr
    born_digital = json.loads((tmp_path / "report.json").read_text())["pages"][0]["stats"]
    scanned = json.loads((tmp_path / "scan.json").read_text())["pages"][0]["stats"]
    assert "regions" not in born_digital, "a text-layer page needs no region pass"
    assert scanned["regions"]["count"] >= 1, "OCR'd blocks get region passes"
    assert json.loads(result.stdout)["decoding"]["speedup"]["kind"].startswith("estimate")


def test_missing_model_is_an_environment_error(docs_dir, tmp_path):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", tmp_path / "no-such-model")
    assert result.exit_code == 4
    assert "cannot load model" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "report.md").exists()


def test_a_broken_settings_file_for_the_models_family_ends_the_run_before_any_work(tiny_model, docs_dir, tmp_path, monkeypatch):
    settings_dir = tmp_path / "config-home" / "hsd" / "models"
    settings_dir.mkdir(parents=True)
    (settings_dir / "qwen2_5_vl.toml").write_text('family = "qwen2_5_vl"\n', encoding="utf-8")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", tiny_model)
    assert result.exit_code == 2, result.stderr
    assert "qwen2_5_vl.toml" in result.stderr and "missing key(s) description" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "report.md").exists()


def test_vlm_stages_without_a_model_are_a_usage_error(docs_dir, tmp_path):
    assert run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "--stages", "page").exit_code == 2


@pytest.mark.slow
def test_a_hanging_vlm_page_falls_back_to_its_draft(tiny_model, docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HSD_DEBUG_STALL", "report.pdf:1:vlm")
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", tiny_model, "--stages", "page",
        "--max-new-tokens", "8", "--page-timeout", "30", "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["documents"][0]["status"] == "degraded"
    pages = json.loads((tmp_path / "report.json").read_text())["pages"]
    assert pages[0]["flags"] == ["fallback", "timeout"] and pages[0]["text_source"] == "draft"
    assert fixtures.TITLE in pages[0]["markdown"], "the draft text stands in for the page"
    assert "report.pdf: page 1: the page ran past --page-timeout and its worker was stopped; the draft stands in" in result.stderr
    assert pages[1]["text_source"] == "model", "the next page still goes through the VLM"


@pytest.mark.parametrize(("fault", "reason", "line"), [
    pytest.param("HSD_DEBUG_CRASH", "crash", "the worker died on this page twice; the draft stands in", marks=pytest.mark.slow),
    ("HSD_DEBUG_RAISE", "vlm_error", "the model failed (RuntimeError: HSD_DEBUG_RAISE on the vlm stage); the draft stands in"),
])
def test_a_vlm_page_that_fails_keeps_its_draft_and_says_why(fault, reason, line, tiny_model, docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(fault, "report.pdf:1:vlm")
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", tiny_model, "--stages", "page",
        "--pages", "1", "--max-new-tokens", "8", "--json",
    )
    assert result.exit_code == 0, result.stderr
    page = json.loads((tmp_path / "report.json").read_text())["pages"][0]
    assert page["flags"] == ["fallback", reason] and page["text_source"] == "draft"
    assert page["notice"] == line and f"report.pdf: page 1: {line}" in result.stderr


def _constant_model(tiny_model, directory, stops_on_it):
    """The tiny model with its output head zeroed: every logit ties and greedy takes token 0,
    <|endoftext|>. Where `stops_on_it` (as real Qwen2.5 configs do) it says nothing; else it
    writes token 0 for ever, a loop."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = shutil.copytree(tiny_model, directory)
    weights = load_file(model / "model.safetensors")
    weights["lm_head.weight"].zero_()
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    if stops_on_it:
        generation = json.loads((model / "generation_config.json").read_text())
        generation["eos_token_id"] = [generation["eos_token_id"], generation["pad_token_id"]]
        (model / "generation_config.json").write_text(json.dumps(generation))
    return model


def test_an_empty_model_reading_is_an_empty_page_not_the_draft(tiny_model, docs_dir, tmp_path):
    silent = _constant_model(tiny_model, tmp_path / "silent", stops_on_it=True)
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", silent, "--stages", "page",
        "--pages", "1", "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["documents"][0]["status"] == "ok"
    page = json.loads((tmp_path / "out" / "report.json").read_text())["pages"][0]
    assert page["flags"] == ["vlm", "empty"] and page["text_source"] == "model" and page["markdown"] == ""
    assert (tmp_path / "out" / "report.md").read_text().strip() == ""
    assert fixtures.TITLE in " ".join(block["text"] for block in page["blocks"]), "the draft stays in the JSON"
    assert "report.pdf: page 1: the model read nothing on this page; it is written empty" in result.stderr


@pytest.mark.slow
def test_a_looping_model_keeps_its_reading_up_to_the_loop_and_the_draft_completes_the_page(tiny_model, docs_dir, tmp_path):
    from hsd_cli.decoding.repetition import REPETITION_SPAN
    from hsd_cli.output.markdown import DRAFT_FOLLOWS

    looping = _constant_model(tiny_model, tmp_path / "looping", stops_on_it=False)
    budget = REPETITION_SPAN + 40
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", looping, "--stages", "page",
        "--pages", "1", "--max-new-tokens", budget, "--baseline", "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["documents"][0]["status"] == "degraded"
    page = json.loads((tmp_path / "out" / "report.json").read_text())["pages"][0]
    assert page["flags"] == ["vlm", "fallback", "repetition"] and page["text_source"] == "model+draft"
    assert page["stats"]["repetition"] == {"start": 0, "unit": 1, "stop": REPETITION_SPAN}
    # The reading before the loop is empty (token 0 is a special token), so the whole draft follows.
    assert page["markdown"].startswith(DRAFT_FOLLOWS) and fixtures.TITLE in page["markdown"]
    # The baseline runs generate without the guard: identical as far as hsd went, cut by the guard.
    baseline = page["stats"]["baseline"]
    assert baseline["identical"] and baseline["guard_stopped_at"] == REPETITION_SPAN and baseline["forwards"] == budget
    assert "report.pdf: page 1: the model looped (a 1-token unit repeated from output token 0)" in result.stderr


def test_figure_text_drafts_the_page_without_a_region_pass_and_furniture_drafts_nothing():
    from hsd_cli.records.kinds import Block, BlockKind
    from hsd_cli.stages.dialect import draft_plan

    def block(kind: BlockKind, text: str) -> Block:
        return Block(kind.value + text, kind, (0.0, 0.0, 10.0, 10.0), 0, text, None, "ocr")

    header, figure, empty_figure, paragraph, footer = (
        block(BlockKind.PAGE_HEADER, "Journal 12"), block(BlockKind.FIGURE, "DATA MIXES 85% code"),
        block(BlockKind.FIGURE, ""), block(BlockKind.TEXT, "Body text."), block(BlockKind.PAGE_FOOTER, "3"),
    )
    blocks = (header, figure, empty_figure, paragraph, footer)
    assert draft_plan(blocks, lambda b: True) == [(figure, False), (paragraph, True)]
    assert draft_plan(blocks, lambda b: False) == [(figure, False), (paragraph, False)]


def test_a_replay_model_warns_on_pages_outside_its_set(tiny_model, docs_dir, tmp_path):
    import shutil
    from dataclasses import asdict

    import pymupdf

    from hsd_cli.replay.fingerprint import REPLAY_FILE, fingerprint
    from hsd_cli.stages.rasterize import render_page

    replay = shutil.copytree(tiny_model, tmp_path / "replay")
    with pymupdf.open(docs_dir / "report.pdf") as doc:
        known = fingerprint(render_page(doc[1], 150, 4_194_304).picture, "report.pdf", 2)
    (replay / REPLAY_FILE).write_text(json.dumps({"fingerprints": [asdict(known)]}))
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", replay, "--stages", "page",
        "--max-new-tokens", "4",
    )
    assert result.exit_code == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "replay model was not built on this page" in line]
    assert len(warned) == 1 and "page 1" in warned[0]
    pages = json.loads((tmp_path / "out" / "report.json").read_text())["pages"]
    assert "outside_replay_set" in pages[0]["flags"] and "outside_replay_set" not in pages[1]["flags"]


def test_bench_pipeline_reads_every_page_in_every_arm_as_generate_does(tiny_model, docs_dir):
    from typer.testing import CliRunner

    from hsd_cli.bench import bench_app

    args = ["pipeline", str(docs_dir), "--model", str(tiny_model), "--dtype", "float32", "--max-new-tokens", "16", "--json"]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["kinds"]) == {"born_digital", "scan"}, "the fixture's text-layer page and its scan"
    for kind, arms in report["kinds"].items():
        assert list(arms) == ["ar", "page", "region-page", "packed", "auto"]
        assert arms["ar"]["tau"] == 1.0 and arms["ar"]["decode_speedup"] == 1.0
        pages = sum(page["kind"] == kind for page in report["pages"])
        for arm in arms.values():
            assert arm["pages"] == pages and arm["identical_share"] == 1.0, "lossless: the tokens of generate"
            assert set(arm) == {"pages", "tau", "decode_s", "e2e_s", "decode_speedup", "e2e_speedup", "identical_share", "projected"}
            assert arm["e2e_s"] > arm["decode_s"] > 0
    assert [page["kind"] for page in report["pages"]] == ["born_digital", "born_digital", "scan"]


def test_bench_pipeline_refuses_an_unknown_arm(tiny_model, docs_dir):
    from typer.testing import CliRunner

    from hsd_cli.bench import bench_app

    result = CliRunner().invoke(bench_app, ["pipeline", str(docs_dir), "--model", str(tiny_model), "--arms", "page,fastest"])
    assert result.exit_code == 2 and "unknown arm(s) fastest" in result.output


def _bench_on_profile(name, forward_s, arms, tiny_model, docs_dir, tmp_path) -> dict:
    """`hsd bench pipeline --profile` on the fixture's born-digital PDF with a profile whose
    forward costs `forward_s(rows, nodes)` at any context and whose prefills cost 50 ms."""
    from typer.testing import CliRunner

    from hsd_cli.bench import bench_app
    from hsd_cli.profiles import ForwardCost, PrefillCost, Profile

    profile = Profile(name, "test", "gpu", "bfloat16", "analytic",
                      tuple(ForwardCost(r, n, c, forward_s(r, n)) for r in (1, 8) for n in (1, 64) for c in (64, 4096)),
                      (PrefillCost(64, 50, 0.05), PrefillCost(2048, 1000, 0.05)))
    profile_file = tmp_path / f"{name}.json"
    profile_file.write_text(json.dumps(profile.to_json()))
    args = ["pipeline", str(docs_dir / "report.pdf"), "--model", str(tiny_model), "--dtype", "float32",
            "--max-new-tokens", "16", "--arms", arms, "--profile", str(profile_file), "--json"]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_bench_pipeline_projects_every_arms_measured_steps_onto_a_profile(tiny_model, docs_dir, tmp_path):
    """On a device where a forward costs the same whatever its width (memory-bound), speculation
    gains what it saves in forwards: the projection prices the measured steps, not the CPU's."""
    report = _bench_on_profile("flat", lambda rows, nodes: 0.01, "page,packed", tiny_model, docs_dir, tmp_path)
    arms = report["kinds"]["born_digital"]
    assert report["profile"] == "flat" and arms["ar"]["projected"]["decode_speedup"] == 1.0
    pages = arms["ar"]["pages"]
    # ar: a prefill and 15 one-node forwards per page, each 10 ms on this profile.
    assert arms["ar"]["projected"]["decode_s"] == pytest.approx(pages * (0.05 + 15 * 0.01), abs=0.01)
    page_forwards = sum(page["arms"]["page"]["forwards"] - 1 for page in report["pages"])
    assert arms["page"]["projected"]["decode_s"] == pytest.approx(pages * 0.05 + page_forwards * 0.01, abs=0.01)
    assert arms["packed"]["projected"]["decode_s"] > arms["page"]["projected"]["decode_s"], "the crops' prefills"


def test_a_plain_reading_is_projected_as_one_forward_per_token(tiny_model, docs_dir, tmp_path):
    """Where the planner chooses plain generate (every node priced), the auto arm costs on the
    profile exactly what `ar` costs: a prefill and a one-node forward per token after the first."""
    report = _bench_on_profile("nodes-dear", lambda rows, nodes: 0.01 * rows * nodes, "auto", tiny_model, docs_dir, tmp_path)
    assert {page["arms"]["auto"]["plan"]["chosen"] for page in report["pages"]} == {"plain"}
    arms = report["kinds"]["born_digital"]
    assert arms["auto"]["projected"]["decode_s"] == pytest.approx(arms["ar"]["projected"]["decode_s"])
    assert arms["ar"]["projected"]["decode_s"] == pytest.approx(arms["ar"]["pages"] * (0.05 + 15 * 0.01), abs=1e-6)
