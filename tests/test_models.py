"""`hsd models`: families with settings and where their models are found."""

import json
import os
import subprocess
import sys

from hsd_cli.models.settings import all_settings, settings_for


def test_every_family_file_loads_and_unknown_families_get_the_default():
    families = {s.family for s in all_settings()}
    assert {"default", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"} <= families
    assert settings_for("no_such_family").family == "default"
    assert "LateX" in settings_for("qwen2_5_vl").page_prompt  # olmOCR's own prompt, typo included


def test_models_reports_what_the_hf_cache_holds(tmp_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2-VL-2B-Instruct" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen2_vl"}')
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    proc = subprocess.run(
        [sys.executable, "-m", "hsd_cli.cli", "models", "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    found = {m["id"]: m["path"] for f in listing["families"] for m in f["models"]}
    assert found["Qwen/Qwen2-VL-2B-Instruct"] == str(snapshot)
    assert found["Qwen/Qwen3-VL-8B-Instruct"] is None
    assert listing["looked_in"]["hf_home"] == str(tmp_path)
