"""`hsd device-check`: on a machine without CUDA one line and exit 4; the rule that judges bf16
decoding against `generate`; and the whole check run on this CPU (a tiny model standing in for the
replay model, its parts shrunk) writes one JSON with every part's figures and the versions."""

import json

import pytest
import torch

from hsd_cli.bench import device_check as check
from tests.conftest import run_hsd


def test_without_cuda_it_says_so_in_one_line_and_exits_4(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = run_hsd("device-check")
    assert result.exit_code == 4 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: no CUDA device here")


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "tpu"], "--device must be cuda or cpu"),
    (["--device", "cpu", "--families", "nope"], "--families: unknown nope"),
])
def test_bad_options_are_one_line_and_exit_2(args, message):
    result = run_hsd("device-check", *args)
    assert result.exit_code == 2 and message in result.stderr and result.stderr.count("\n") == 1


def test_bf16_decoding_may_leave_generate_only_at_a_near_tie_for_one_of_the_tied_tokens():
    logits = torch.full((3, 6), -1.0)
    logits[1, 2] = logits[1, 4] = 2.0  # a tie at token 1
    logits[2, 5] = 4.0  # a clear best at token 2
    reference = [0, 2, 5]
    assert check.verdict([0, 2, 5], reference, logits) == "identical"
    assert check.verdict([0, 4, 1], reference, logits) == "near-tie at token 1"
    assert check.verdict([0, 3, 5], reference, logits) == "diverged at token 1"
    assert check.verdict([0, 2, 1], reference, logits) == "diverged at token 2"
    assert check.verdict([0, 2], reference, logits) == "diverged at token 2", "stopped short"


@pytest.mark.slow
def test_the_check_on_this_cpu_writes_one_json_with_every_part(tiny_model, docs_dir, tmp_path, monkeypatch):
    # bf16 runs in reference kernels on this CPU: every part shrunk to keep the test to a minute or two.
    monkeypatch.setattr(check, "LENGTH", 16)
    monkeypatch.setattr(check, "PROFILE_NODES", (1, 2))
    monkeypatch.setattr(check, "PROFILE_CONTEXTS", (64,))
    monkeypatch.setattr(check, "PROFILE_SIDES", (224,))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    output = tmp_path / "check.json"
    result = run_hsd("device-check", "--device", "cpu", "--families", "qwen2_5_vl", "--replay-model", tiny_model,
                     "--pages", docs_dir / "report.pdf", "--rows", "1,2", "--repeats", "1", "--max-new-tokens", "8", "-o", output)
    assert result.exit_code == 0, result.stderr
    report = json.loads(output.read_text())
    assert report["device"] == "cpu" and report["dtype"] == "bfloat16" and report["exact"] is True
    assert {"hsd", "torch", "cuda", "transformers", "python", "device_name"} <= set(report["versions"])
    family = report["exactness"]["qwen2_5_vl"]
    assert family["plain"] == "identical" and set(family["speculative"]) == {"whole draft", "noisy draft"}
    assert report["profile"]["kind"] == "measured" and report["profile"]["dtype"] == "bfloat16"
    assert {f["rows"] for f in report["profile"]["forwards"]} == {1, 2}
    bench = report["throughput"]
    assert bench["dtype"] == "bfloat16" and bench["sized"] and bench["profile"] == report["profile"]["name"]
    assert set(bench["kinds"]["all"]["by_rows"]) == {"1", "2"}
    assert set(report["seconds"]) == {"exactness qwen2_5_vl", "profile", "throughput", "total"}
