"""Lossless tree-attention speculative decoding for transformers VLMs.

Knows nothing about PDFs or OCR. Typical use:

    target = load_target("path/or/id", device="cpu", dtype="bfloat16")
    result = decode(target, image, prompt, drafts=["draft text", ...])   # match="chars" for
    result.text, result.stats.tau                                         # drafts in other markup
    results = decode_many(target, [(crop, prompt, [draft]), ...], batch_size=8)
"""

from .loop import DecodeConfig, DecodeRequest, DecodeResult, decode, decode_batch, decode_many, decode_result, make_proposer
from .proposer import DraftProposer, NoDraftProposer, ProposerConfig, TextDraftProposer
from .repetition import RepetitionLoop, find_repetition, repetition_stop
from .stats import DecodeStats
from .target import HFTarget, UnsupportedTransformersError, check_cache_layout, load_target
from .verify import SamplingConfig, inside_tex_math, math_guard

__all__ = [
    "DecodeConfig",
    "DecodeRequest",
    "DecodeResult",
    "DecodeStats",
    "DraftProposer",
    "HFTarget",
    "NoDraftProposer",
    "ProposerConfig",
    "RepetitionLoop",
    "SamplingConfig",
    "TextDraftProposer",
    "UnsupportedTransformersError",
    "check_cache_layout",
    "decode",
    "decode_batch",
    "decode_many",
    "decode_result",
    "find_repetition",
    "load_target",
    "inside_tex_math",
    "make_proposer",
    "math_guard",
    "repetition_stop",
]
