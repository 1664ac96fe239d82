"""Families the loop cannot decode losslessly are refused by name, with the reason; the families
over Qwen3.5's hybrid text model are served."""

import pytest

from hsd_cli.decoding.hf_target.families import ADAPTERS, REFUSED, UnsupportedFamilyError, adapter_for


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_refused_family_is_one_line_naming_its_reason(model_type):
    with pytest.raises(UnsupportedFamilyError) as raised:
        adapter_for(model_type)
    message = str(raised.value)
    assert "\n" not in message
    assert message == f"model family {model_type!r} cannot be decoded losslessly by hsd: {REFUSED[model_type]}"


@pytest.mark.parametrize("model_type", ["qwen3_5", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7"])
def test_the_qwen3_5_text_families_are_served(model_type):
    """Chandra 2's qwen3_5 and the MiniCPM families over the same hybrid text model."""
    assert model_type in ADAPTERS and model_type not in REFUSED
    assert adapter_for(model_type) is ADAPTERS[model_type]


def test_a_family_without_an_adapter_is_not_supported():
    with pytest.raises(UnsupportedFamilyError, match="model family 'llava' is not supported; supported: "):
        adapter_for("llava")


def test_no_family_is_both_served_and_refused():
    assert not set(REFUSED) & set(ADAPTERS)
