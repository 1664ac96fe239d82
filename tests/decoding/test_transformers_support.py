"""The adapter edits transformers' KV cache tensors directly: the installed transformers must keep
them where the adapter knows, and when it does not, loading says so in one line."""

import tomllib
from pathlib import Path

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from hsd_cli.decoding.hf_target.cache import SUPPORTED_TRANSFORMERS, UnsupportedTransformersError, cache_layout_problem
from hsd_cli.decoding.hf_target import load_target
from tests.conftest import run_hsd


def test_installed_transformers_keeps_the_cache_layout_the_adapter_edits():
    problem = cache_layout_problem()
    assert problem is None, (
        f"{problem}. hsd_cli/decoding/hf_target/cache.py is tested with transformers{SUPPORTED_TRANSFORMERS} only: "
        "adapt its cache edits to this version, then widen SUPPORTED_TRANSFORMERS and the pin in pyproject.toml"
    )


def test_the_package_requires_the_tested_transformers_versions():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    requirement = next(d for d in pyproject["project"]["dependencies"] if d.startswith("transformers"))
    assert requirement == f"transformers{SUPPORTED_TRANSFORMERS}"


def update_into_renamed_tensors(self, key_states, value_states, *args, **kwargs):
    """DynamicLayer.update as a transformers that moved the cache tensors elsewhere would do it."""
    if not self.is_initialized:
        self.lazy_initialization(key_states, value_states)
        self.keys = self.values = None
        self.key_states, self.value_states = key_states, value_states
    else:
        self.key_states = torch.cat([self.key_states, key_states], dim=-2)
        self.value_states = torch.cat([self.value_states, value_states], dim=-2)
    return self.key_states, self.value_states


@pytest.fixture
def unknown_cache_layout(monkeypatch):
    monkeypatch.setattr(DynamicLayer, "update", update_into_renamed_tensors)


def test_an_unknown_cache_layout_is_detected(unknown_cache_layout):
    assert "DynamicLayer.keys" in cache_layout_problem()


def test_loading_with_an_unknown_cache_layout_is_a_one_line_error(unknown_cache_layout, tmp_path):
    with pytest.raises(UnsupportedTransformersError) as raised:
        load_target(str(tmp_path / "any-model"))  # fails before looking for the model
    assert "\n" not in str(raised.value) and f"transformers{SUPPORTED_TRANSFORMERS}" in str(raised.value)


def test_convert_with_an_unknown_cache_layout_stops_before_any_work(unknown_cache_layout, docs_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path / "out", "--model", model)
    assert result.exit_code == 4
    assert f"transformers{SUPPORTED_TRANSFORMERS}" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "report.md").exists()
