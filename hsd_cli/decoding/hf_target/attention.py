"""hsd's attention function, registered in transformers' AttentionInterface as `hsd_sdpa`: SDPA,
with a masked forward of many queries run on the key-value heads as they are stored.

transformers' SDPA attention (integrations/sdpa_attention.py) repeats keys and values over the
query heads of each group (`repeat_kv`) whenever a forward of more than one query has a mask and
the device's SDPA takes no masked GQA: every tree forward, on CUDA and the CPU. For a 7B with 28
query heads over 4 key-value heads that is 7 copies of every row's whole cache, every layer,
every step. Here the groups are folded into the query length instead: queries (B, H, q, d) are
viewed as (B, kv_heads, groups * q, d), the mask repeated over the groups (q rows of the context
each, a few MB), and one SDPA call attends each key-value head's group of queries to its keys
once. Every query's dot products, softmax and sum are those it has with the keys repeated.

Folded, each query's sums run over other matrix shapes, which CPUs block differently: outputs
differ from the repeated heads' by an ulp or so in fp32 (measured), so the fold would change
plain decoding's bits where `generate` meets a mask (a padded batch's prefill). It is therefore
used in tree forwards only (`tree_forward()`, which HFTarget.forward_tree enters), where the
exactness tests hold tree logits to the model's own forward within SAME_LOGITS and tokens to
`generate`'s; and there only where the repeated mask is smaller than the repeated keys and
values (`folds`), the mask repeated once a forward. Everything else (prefills, `generate`, one query, no mask, a model without
head groups, a position bias, a paged cache) is transformers' own SDPA unchanged. Families whose
text attention is not SDPA keep theirs (`use_hsd_attention`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

HSD_SDPA = "hsd_sdpa"
# In a tree forward (the only ones folded), the masks folded so far by this thread: every layer is
# given the same mask, which is then repeated over the groups once per forward, not once a layer.
# (id(mask), groups) -> (the mask, kept so that its id stays its own, and its folded form).
_tree_masks: ContextVar[dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] | None] = ContextVar("tree_masks", default=None)


@contextmanager
def tree_forward() -> Iterator[None]:
    """Within: the model's masked attention folds head groups (a tree forward's)."""
    token = _tree_masks.set({})
    try:
        yield
    finally:
        _tree_masks.reset(token)


def folds(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, groups: int) -> bool:
    """Whether a forward is folded: head groups, a mask shared by every head or given per head,
    more than one query, and the mask repeated over the groups smaller than the keys and values
    repeated over them."""
    if groups <= 1 or mask is None or query.shape[2] <= 1 or mask.dim() != 4 or mask.shape[1] not in (1, query.shape[1]):
        return False
    mask_bytes = mask.shape[0] * groups * query.shape[2] * mask.shape[-1] * mask.element_size()
    repeat_bytes = 2 * key.shape[0] * query.shape[1] * key.shape[2] * key.shape[3] * key.element_size()
    return mask_bytes < repeat_bytes


def fold_queries(query: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H, q, d) queries as (B, H / groups, groups * q, d): query head h = k * groups + g (the
    head repeat_kv pairs with key-value head k) becomes rows g * q .. g * q + q - 1 of head k."""
    batch, heads, length, dim = query.shape
    return query.reshape(batch, heads // groups, groups * length, dim)


def fold_mask(mask: torch.Tensor, groups: int, heads: int) -> torch.Tensor:
    """The mask of `fold_queries`' rows: one shared by the heads repeated over the groups, one per
    head regrouped."""
    if mask.shape[1] == 1:
        return mask.repeat(1, 1, groups, 1)
    return mask.reshape(mask.shape[0], heads // groups, groups * mask.shape[2], mask.shape[-1])


def _folded_mask(masks: dict, mask: torch.Tensor, groups: int, heads: int) -> torch.Tensor:
    """`fold_mask`, made once per forward for the mask every layer is given."""
    key = (id(mask), groups)
    if key not in masks or masks[key][0] is not mask:
        masks[key] = (mask, fold_mask(mask, groups, heads))
    return masks[key][1]


def hsd_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, with a masked forward of many queries folded (module doc)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    masks = _tree_masks.get()
    plain = kwargs.get("position_bias") is not None or kwargs.get("cache") is not None or kwargs.get("softcap") is not None
    if plain or masks is None or kwargs.get("output_attentions") or not folds(query, key, attention_mask, groups):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    heads, length = query.shape[1], query.shape[2]
    mask = _folded_mask(masks, attention_mask, groups, heads)
    out = torch.nn.functional.scaled_dot_product_attention(
        fold_queries(query, groups), key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
    )
    # (B, kv_heads, groups * q, dv) -> (B, H, q, dv) -> (B, q, H, dv), as transformers returns it.
    return out.reshape(out.shape[0], -1, length, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> None:
    """`hsd_sdpa` in transformers' AttentionInterface, with SDPA's masks (masking_utils builds no
    mask at all for an implementation it does not know), idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(HSD_SDPA, hsd_sdpa_forward)
    AttentionMaskInterface.register(HSD_SDPA, sdpa_mask)


def use_hsd_attention(model) -> bool:
    """Switch the model's text model to `hsd_sdpa` where its attention is SDPA (the layers whose
    keys and values are cached and verified in trees; a vision tower keeps its own); returns
    whether it was switched."""
    register()
    config = model.config
    text = config.get_text_config()
    if getattr(text, "_attn_implementation", None) != "sdpa":
        return False
    key = next((key for key in config.sub_configs if getattr(config, key, None) is text), None)
    model.set_attn_implementation(HSD_SDPA if key is None and text is config else {key: HSD_SDPA})
    return text._attn_implementation == HSD_SDPA
