from dataclasses import fields, replace

import pytest

from hsd_cli.config import ConvertConfig, DraftBackendName, ImageMode, Stages, UsageError, parse_page_ranges, select_pages
from hsd_cli.document.tasks import OUTPUT_NEUTRAL_FIELDS, RECORDED_WHEN_SET_FIELDS as RECORDED_WHEN_SET, config_hash, output_config
from hsd_cli.config import ModelConfig, ResolvedConfig, ScheduleConfig, Sizing


def _resolved(config: ConvertConfig, page_timeout: float) -> ResolvedConfig:
    """`config` as the parent would resolve it for a model of family qwen2_5_vl on the CPU."""
    model = None
    if config.runs_model:
        model = ModelConfig(
            config.model, "qwen2_5_vl", config.device or "cpu", config.dtype or "float32", config.trust_remote_code,
            config.max_new_tokens or 4096, config.baseline, config.profile, near_lossless=config.near_lossless,
            recipe=config.recipe or "", greedy=config.greedy, seed=config.seed, layout_model=config.layout_model,
        )
    return ResolvedConfig(config.document, model, ScheduleConfig(1, Sizing.PAGE, 0, page_timeout, 0.0, 0.2, 50))


def test_page_ranges_parse_singles_spans_and_open_ends():
    assert parse_page_ranges("1-3,7, 10-") == [(1, 3), (7, 7), (10, None)]


@pytest.mark.parametrize("spec", ["", "0", "3-1", "a", "1,,2", "-"])
def test_bad_page_ranges_are_usage_errors(spec):
    with pytest.raises(UsageError):
        parse_page_ranges(spec)


def test_select_pages_clips_to_the_document_and_deduplicates():
    assert select_pages("2-3,3,9-", page_count=4) == [1, 2]
    assert select_pages(None, page_count=2) == [0, 1]
    assert select_pages("5", page_count=2) == []


def test_config_rejects_out_of_range_dpi(tmp_path):
    with pytest.raises(UsageError):
        ConvertConfig(output_dir=tmp_path, dpi=5)


def _a_different_value(name, value, tmp_path):
    """Another valid value of a ConvertConfig field, to see whether the hash notices it."""
    others = {
        "pages": "2", "dpi": 200, "max_pixels": 2_000_000, "draft_backend": DraftBackendName.OCR,
        "draft_json_dir": tmp_path / "drafts", "images": ImageMode.NONE, "page_markers": True,
        "stages": Stages.PAGE, "model": "another/model", "device": "cuda", "dtype": "bfloat16",
        "max_new_tokens": 100, "baseline": True, "profile": "h100", "near_lossless": 0.75,
        "recipe": "olmocr-2", "greedy": True, "seed": 7, "layout_model": str(tmp_path / "layout"),
    }
    assert others[name] != value, name
    return others[name]


def test_every_option_that_can_change_output_bytes_is_hashed_and_in_the_json_config(tmp_path):
    """A new ConvertConfig field must be hashed for resume (and shown in the JSON's `config`) or be
    declared output-neutral; this test fails on one that is neither. A field recorded only when
    set is shown once set."""
    base = ConvertConfig(output_dir=tmp_path, model="some/model")
    shown = output_config(_resolved(base, 600.0))
    for field in fields(ConvertConfig):
        if field.name in OUTPUT_NEUTRAL_FIELDS:
            assert field.name not in shown
            continue
        changed = replace(base, **{field.name: _a_different_value(field.name, getattr(base, field.name), tmp_path)})
        if field.name in RECORDED_WHEN_SET:
            assert field.name not in shown and field.name in output_config(_resolved(changed, 600.0)), field.name
        else:
            assert field.name in shown, f"{field.name}: neither hashed nor declared output-neutral"
        assert config_hash(_resolved(changed, 600.0)) != config_hash(_resolved(base, 600.0)), field.name


@pytest.mark.parametrize("tau", [0.0, -0.5, 1.5])
def test_near_lossless_is_within_zero_and_one(tmp_path, tau):
    with pytest.raises(UsageError, match="--near-lossless must be within"):
        ConvertConfig(output_dir=tmp_path, model="some/model", near_lossless=tau)


def test_near_lossless_needs_a_model(tmp_path):
    with pytest.raises(UsageError, match="needs a VLM"):
        ConvertConfig(output_dir=tmp_path, near_lossless=0.5)


def test_the_page_timeout_is_hashed_where_the_planner_can_leave_a_page_to_its_draft(tmp_path):
    planned = ConvertConfig(output_dir=tmp_path, model="some/model")  # --stages auto
    assert config_hash(_resolved(planned, 600.0)) != config_hash(_resolved(planned, 60.0))
    assert output_config(_resolved(planned, 60.0))["page_timeout"] == 60.0
    for unplanned in (ConvertConfig(output_dir=tmp_path), ConvertConfig(output_dir=tmp_path, model="m", stages=Stages.PAGE)):
        assert config_hash(_resolved(unplanned, 600.0)) == config_hash(_resolved(unplanned, 60.0))
        assert "page_timeout" not in output_config(_resolved(unplanned, 60.0))
