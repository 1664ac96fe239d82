"""A window over generated tokens: Unlimited-OCR's reference sliding-window attention (R-SWA),
where every token sees the whole prompt but only the last `window` generated tokens (itself
included).

transformers draws it with a cache layer that keeps the prompt's states and evicts generated
ones past the window, and a mask (`create_reference_sliding_window_causal_mask`) that hides the
rest: a token at text index q sees a generated token at index k iff k > q - window. hsd keeps
every slot in plain layers (its cache edits and tree forwards need them) and hides, in the mask of
every forward it runs, what the window leaves out: a generated token (k >= the row's prompt
length) at k <= q - window, along each node's path. Indices count a row's real tokens, its
padding left out, as `generate` counts a row's cache positions after its prompt.
"""

from __future__ import annotations

import torch

WINDOW_LAYER_TYPE = "reference_sliding_attention"


def generated_window(config) -> int | None:
    """The window over generated tokens of a model whose text layers are R-SWA ones, or None where
    none is. A window on some layers only is refused: hsd draws one mask for every layer."""
    text = config.get_text_config(decoder=True)
    kinds = set(getattr(text, "layer_types", None) or ())
    if WINDOW_LAYER_TYPE not in kinds:
        return None
    if kinds != {WINDOW_LAYER_TYPE}:
        raise ValueError(f"layer types {sorted(kinds)}: a window on some layers only is not supported (one mask serves every layer)")
    return int(text.sliding_window)


def window_hides(node_index: torch.Tensor, prompt_len: torch.Tensor, window: int) -> bool:
    """Whether some node (text index `node_index`, (B, K)) is past the point where its window
    leaves out a generated token: until then each node sees everything, as without a window."""
    return bool((node_index - window >= prompt_len[:, None]).any())


def hide_outside_window(
    mask: torch.Tensor, column_index: torch.Tensor, node_index: torch.Tensor, prompt_len: torch.Tensor, window: int
) -> torch.Tensor:
    """The additive `mask` (B, 1, K, C) with every generated token a node's window leaves out
    hidden: column c holds the token at text index column_index[b, c] ((B, C); any index where
    `mask` hides the column already), node k is at node_index[b, k] ((B, K))."""
    columns = column_index.to(mask.device)[:, None, :]
    generated = columns >= prompt_len.to(mask.device)[:, None, None]
    too_old = columns <= node_index.to(mask.device)[:, :, None] - window
    return mask.masked_fill((generated & too_old)[:, None], torch.finfo(mask.dtype).min)
