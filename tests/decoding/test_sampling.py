"""Keyed sampling in a batch: rows draw independently, speculation emits what plain sampling
emits row by row, and a step's memory does not grow with tree nodes x vocabulary."""

from pathlib import Path

import pytest

from hsd_cli.decoding.hf_target import HFTarget, load_target
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.tree import TokenTree
from hsd_cli.decoding.verify import SamplingConfig
from hsd_cli.models.tiny_families import build_tiny_random

from .test_exactness import edit


@pytest.fixture(scope="module")
def qwen_target(tmp_path_factory):
    model_dir = build_tiny_random("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))
    return load_target(str(model_dir), device="cpu", dtype="float32")


def test_rows_of_a_batch_sample_independently_and_speculation_matches_plain_row_by_row(qwen_target, page_image):
    config = DecodeConfig(max_new_tokens=60, repetition_guard=False, sampling=SamplingConfig(temperature=1.0, top_p=0.95, seed=4))
    same = [(page_image, "Transcribe the text.")] * 3
    plain = decode_batch(qwen_target, [DecodeRequest(image, prompt, NoDraftProposer()) for image, prompt in same], config)
    assert len({tuple(r.tokens) for r in plain}) == 3, "the same request in three rows must draw three outputs"
    drafts = [DraftProposer([edit(r.tokens, row, substitute=0.05)]) for row, r in enumerate(plain)]
    speculative = decode_batch(qwen_target, [DecodeRequest(image, prompt, d) for (image, prompt), d in zip(same, drafts)], config)
    assert [r.tokens for r in speculative] == [r.tokens for r in plain]
    assert all(r.stats.accepted > 20 for r in speculative)


class FortyNodeChains:
    """Proposes 40 draft tokens every step, the trie budget's worth."""

    def start(self):
        pass

    def propose(self, context):
        return TokenTree.chain(context[-1], list(range(300, 340)))

    def observe(self, accepted):
        pass


def memory_bytes(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux /proc")
def test_a_sampling_step_with_a_real_vocabulary_holds_little_beyond_its_logits(qwen_target):
    # Qwen's real vocabulary: 8 rows x 41 nodes x 152,064 logits are 200 MB of fp32. Noise for
    # every node in float64 (as sampling once drew it) adds 400 MB per copy and peaked at 1.6 GB.
    model = qwen_target.model
    original_vocabulary = model.get_output_embeddings().weight.shape[0]
    model.resize_token_embeddings(152_064, mean_resizing=False)
    try:
        target = HFTarget(model, qwen_target.processor, qwen_target.adapter)
        config = DecodeConfig(max_new_tokens=4, repetition_guard=False, sampling=SamplingConfig(temperature=1.0, top_p=0.9, seed=1))

        def run():
            return decode_batch(target, [DecodeRequest(None, f"Read {i}.", FortyNodeChains()) for i in range(8)], config)

        run()  # allocator and weights warm
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS
        before = memory_bytes("VmRSS")
        results = run()
        peak = memory_bytes("VmHWM") - before
    finally:
        model.resize_token_embeddings(original_vocabulary)
    logits = 8 * 41 * 152_064 * 4
    assert all(len(r.tokens) == 4 for r in results)
    assert peak < 1.5 * logits, f"a step peaked {peak / 2**20:.0f} MB above the start, logits are {logits / 2**20:.0f} MB"
