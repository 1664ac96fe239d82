"""The target: the one part of the decoding core that knows transformers. `families` (what differs
between model families), `target` (the model seen as a tree-verification target), `cache` (the
KV-cache edits and the transformers versions whose layout they know), `kv_store` (a KV cache
written in place, with `kv_store=StoreConfig()`), `attention` (hsd's SDPA attention: tree forwards
fold the query-head groups instead of repeating keys and values), `generate` (plain `generate`, the baseline),
`devices` (default device and dtype)."""

from .cache import SUPPORTED_TRANSFORMERS, UnsupportedTransformersError, check_cache_layout
from .kv_store import StoreConfig
from .target import HFTarget, load_target

__all__ = ["SUPPORTED_TRANSFORMERS", "HFTarget", "StoreConfig", "UnsupportedTransformersError", "check_cache_layout", "load_target"]
