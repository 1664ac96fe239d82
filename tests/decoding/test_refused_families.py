"""Families the loop cannot decode losslessly are refused by name, with the reason, and the reason
holds for the installed transformers."""

import re

import pytest
from transformers import CONFIG_MAPPING

from hsd_cli.decoding.hf_target.families import ADAPTERS, REFUSED, UnsupportedFamilyError, adapter_for


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_refused_family_is_one_line_naming_its_reason(model_type):
    with pytest.raises(UnsupportedFamilyError) as raised:
        adapter_for(model_type)
    message = str(raised.value)
    assert "\n" not in message
    assert message == f"model family {model_type!r} cannot be decoded losslessly by hsd: {REFUSED[model_type]}"


def test_minicpm_ocr_is_refused_and_chandra_2s_qwen3_5_served():
    assert "minicpm_ocr" in REFUSED
    assert "qwen3_5" in ADAPTERS and "qwen3_5" not in REFUSED


def test_a_family_without_an_adapter_is_not_supported():
    with pytest.raises(UnsupportedFamilyError, match="model family 'llava' is not supported; supported: "):
        adapter_for("llava")


def test_no_family_is_both_served_and_refused():
    assert not set(REFUSED) & set(ADAPTERS)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_each_refused_family_has_the_linear_attention_its_reason_names(model_type):
    text_config = CONFIG_MAPPING[model_type]().text_config
    named = re.search(r"its text model \((\w+)\) has Gated DeltaNet linear-attention layers", REFUSED[model_type])
    assert named and named.group(1) == text_config.model_type
    # A checkpoint may set its own layer_types; the architecture's default interleaves both kinds.
    assert {"linear_attention", "full_attention"} <= set(text_config.layer_types)
