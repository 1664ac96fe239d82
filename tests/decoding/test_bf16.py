"""bf16 (the default dtype on accelerators and on CPUs that compute it natively) against transformers' `generate` in bf16, on the tiny model of every
family.

Plain decoding by our loop (one token per forward, as `generate` runs) must equal `generate`
token for token. Speculative decoding runs the same model over several tree nodes per forward:
other matmul shapes, so bf16 rounds differently and a logit can move by a bf16 unit. Where the
two best logits of `generate` are within one bf16 unit of each other (a near-tie: in bf16 they
often are exactly equal), the argmax can flip. So speculation must equal `generate` up to its
first divergence, and a divergence is allowed only at such a near-tie, to one of the tied tokens.
"""

import math

import torch

from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer

from .test_exactness import PROMPT, edit

LENGTH = 128
CONFIG = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)


def bf16_unit(value: float) -> float:
    """The spacing of bf16 numbers (8 significant bits) around `value`."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7)


def test_bf16_decoding_equals_generate_except_at_near_ties(bf16_target, page_image):
    inputs = bf16_target.inputs([page_image], [PROMPT])
    out = bf16_target.model.generate(
        **inputs, max_new_tokens=LENGTH, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    reference = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    logits = torch.stack(out.logits)[:, 0].float()
    plain = decode_batch(bf16_target, [DecodeRequest(page_image, PROMPT, NoDraftProposer())], CONFIG)[0]
    assert plain.tokens == reference
    for draft in (reference, edit(reference, 1, substitute=0.1, insert=0.1, delete=0.1)):
        result = decode_batch(bf16_target, [DecodeRequest(page_image, PROMPT, DraftProposer([draft]))], CONFIG)[0]
        assert result.stats.accepted > 10
        divergence = next((i for i, (a, b) in enumerate(zip(result.tokens, reference)) if a != b), None)
        if divergence is None:
            assert len(result.tokens) == LENGTH
            continue
        top = logits[divergence].max().item()
        tied = (logits[divergence] >= top - bf16_unit(top)).nonzero().view(-1).tolist()
        assert len(tied) >= 2 and result.tokens[divergence] in tied, (
            f"diverged from generate at token {divergence}, where its best logit {top:.4f} has no near-tie: {tied}"
        )


def test_a_cpu_without_native_bf16_defaults_to_float32(monkeypatch):
    """Without AVX512-BF16 or AMX, torch multiplies bf16 in a reference kernel, many times slower
    than fp32: such a CPU gets fp32 unless the user asks for bf16."""
    from hsd_cli.decoding.hf_target import devices

    monkeypatch.setattr(devices, "cpu_computes_bf16", lambda: False)
    assert devices.default_dtype("cpu") == "float32"
    assert devices.default_dtype("cuda") == "bfloat16"
    monkeypatch.setattr(devices, "cpu_computes_bf16", lambda: True)
    assert devices.default_dtype("cpu") == "bfloat16"
