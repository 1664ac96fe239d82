"""Lossless tree-attention speculative decoding for transformers VLMs.

Knows nothing about PDFs or OCR. Typical use:

    target = load_target("path/or/id", device="cpu", dtype="bfloat16")
    result = decode(target, image, prompt, drafts=["draft text", ...])   # match="chars" for
    result.text, result.stats.tau                                         # drafts in other markup
    results = decode_many(target, [(crop, prompt, [draft]), ...], batch_size=8)

Names load their module on first use: the statistics and the repetition guard are plain Python,
and a process that needs only them (a draft-only worker, the run's parent) never imports torch.
"""

from importlib import import_module
from typing import Any

_MODULE_OF = {
    "DecodeConfig": "sequence",
    "DecodeRequest": "sequence",
    "DecodeResult": "loop",
    "DecodeStats": "stats",
    "DraftProposer": "proposer",
    "HFTarget": "hf_target",
    "LoadSizer": "sizing",
    "LogitsRules": "logits_rules",
    "ReadSizers": "sizing",
    "NearLossless": "verify",
    "NoDraftProposer": "proposer",
    "ProposerConfig": "proposer",
    "RepetitionLoop": "repetition",
    "SamplingConfig": "verify",
    "StoreConfig": "hf_target",
    "TextDraftProposer": "proposer",
    "UnsupportedTransformersError": "hf_target",
    "check_cache_layout": "hf_target",
    "decode": "loop",
    "decode_batch": "loop",
    "decode_many": "loop",
    "decode_result": "loop",
    "draft_allowance": "loop",
    "find_repetition": "repetition",
    "load_target": "hf_target",
    "make_proposer": "loop",
    "repetition_stop": "repetition",
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value
