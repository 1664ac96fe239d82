"""A model's family picks its adapter; a family without one is named in one line with the ones hsd
knows. The families over Qwen3.5's hybrid text model are served."""

import pytest

from hsd_cli.decoding.hf_target.families import ADAPTERS, UnsupportedFamilyError, adapter_for


@pytest.mark.parametrize("model_type", ["qwen3_5", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7"])
def test_the_qwen3_5_text_families_are_served(model_type):
    """Chandra 2's qwen3_5 and the MiniCPM families over the same hybrid text model."""
    assert adapter_for(model_type) is ADAPTERS[model_type]


def test_a_family_without_an_adapter_is_not_supported_in_one_line():
    with pytest.raises(UnsupportedFamilyError) as raised:
        adapter_for("llava")
    message = str(raised.value)
    assert "\n" not in message
    assert message == f"model family 'llava' is not supported; supported: {sorted(ADAPTERS)}"
