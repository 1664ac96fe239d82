"""The maths of a Gated DeltaNet layer over a token tree: its causal conv and its chunked gated
delta rule with each node reading its own ancestor path, and the states a commit rebuilds.

transformers' Qwen3.5 layer reads a forward's tokens as one sequence. Over a tree, node i must
see only its ancestors: the conv's window is i's nearest ancestors (the cached conv inputs above
the root), and the chunked rule's within-chunk cumulative decay becomes a sum along i's ancestor
path, `G = g @ ancestors.T`, with pairwise decays exp(G_i - G_j) only where j is an ancestor of
i. Trees list parents before children, so the delta rule's triangular system stays lower
triangular. All of it in fp32, as transformers' torch path and the fla kernels compute it. Plain
tensors only: hybrid.py connects it to transformers' layer and cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NodeRecord:
    """What one linear-attention layer keeps of a tree forward so that a commit can rebuild its
    states for any accepted path without a second forward."""

    conv_inputs: torch.Tensor  # (B, channels, N): each node's conv input, in the cache's dtype
    keys: torch.Tensor  # (B, heads, N, key_dim) fp32, l2-normalised (value heads)
    deltas: torch.Tensor  # (B, heads, N, value_dim) fp32: what each node writes into the state
    decays: torch.Tensor  # (B, heads, N) fp32: G, the log decay summed from the root down to the node


def tree_parents(ancestors: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """(B, N) parent of every node, -1 for roots (and padding nodes, which see only themselves)."""
    one_up = ancestors & (depths[:, None, :] == depths[:, :, None] - 1)
    return torch.where(one_up.any(-1), one_up.to(torch.int8).argmax(-1), -1)


def conv_sources(parents: torch.Tensor, depths: torch.Tensor, kernel: int) -> torch.Tensor:
    """(B, N, kernel) where each tap of every node's conv window reads, as indices into the
    cached conv inputs (`kernel` of them, oldest first) followed by the tree's nodes: the node
    itself last, its ancestors before it, the cached inputs above the root."""
    node = torch.arange(parents.shape[1]).expand_as(parents)
    taps = [kernel + node]
    above = node
    for distance in range(1, kernel):
        above = torch.where(above >= 0, parents.gather(1, above.clamp(min=0)), -1)
        cached = kernel + depths - distance  # the cached input `distance` tokens above the node
        taps.append(torch.where(above >= 0, kernel + above.clamp(min=0), cached))
    return torch.stack(taps[::-1], dim=-1)


def tree_conv(inputs: torch.Tensor, cached: torch.Tensor, sources: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """The depthwise causal conv over the tree: inputs (B, C, N), cached (B, C, kernel), sources
    from `conv_sources`, weight (C, kernel). (B, C, N), before the activation, in weight's dtype:
    summed in fp32 and rounded once, as conv kernels accumulate (bf16 products summed in bf16
    would round at every tap)."""
    sequence = torch.cat([cached, inputs], dim=-1).to(weight.dtype).float()
    rows, channels, width = inputs.shape
    index = sources.reshape(rows, 1, -1).expand(-1, channels, -1).to(sequence.device)
    windows = sequence.gather(2, index).reshape(rows, channels, width, -1)
    out = (windows * weight.float()[None, :, None, :]).sum(-1)
    return (out if bias is None else out + bias.float()[None, :, None]).to(weight.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' (and fla's) l2norm of the gated delta rule."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def tree_gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    ancestors: torch.Tensor, state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunked gated delta rule over one chunk that is a tree, from the cached `state`.

    query, key: (B, N, key_heads, key_dim); value: (B, N, heads, value_dim); g, beta: (B, N,
    heads); ancestors: (B, N, N) bool, j an ancestor of i or i itself; state: (B, heads,
    key_dim, value_dim). Returns the output (B, N, heads, value_dim) in query's dtype, and the
    fp32 keys, deltas and decays (G) a commit needs (see `NodeRecord`).
    """
    dtype = query.dtype
    heads = value.shape[2]
    if key.shape[2] != heads:  # grouped value heads: each key head serves consecutive value heads
        query = query.repeat_interleave(heads // key.shape[2], dim=2)
        key = key.repeat_interleave(heads // key.shape[2], dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
    query, key = l2norm(query) * query.shape[-1] ** -0.5, l2norm(key)
    seen = ancestors[:, None].to(query.device)  # (B, 1, N, N)
    decays = torch.einsum("bhj,bij->bhi", g, seen[:, 0].to(torch.float32))  # G = g @ ancestors.T
    pairwise = (decays[..., :, None] - decays[..., None, :]).masked_fill(~seen, float("-inf")).exp()
    key_beta = key * beta[..., None]
    system = (key_beta @ key.transpose(-1, -2)) * pairwise  # unit lower triangle: only strict ancestors count
    new_values = torch.linalg.solve_triangular(system, value * beta[..., None], upper=False, unitriangular=True)
    state_reads = torch.linalg.solve_triangular(system, key_beta * decays.exp()[..., None], upper=False, unitriangular=True)
    state = state.to(torch.float32)
    deltas = new_values - state_reads @ state
    out = (query * decays.exp()[..., None]) @ state + ((query @ key.transpose(-1, -2)) * pairwise) @ deltas
    return out.transpose(1, 2).to(dtype), key, deltas, decays


def path_states(record: NodeRecord, state: torch.Tensor, conv: torch.Tensor, paths: torch.Tensor, lengths: torch.Tensor):
    """The recurrent and conv states after each row's accepted path, rebuilt from `record`.

    state: (B, heads, key_dim, value_dim) and conv: (B, channels, kernel), as cached before the
    tree; paths: (B, M) node indices from the root down, each row's first `lengths` valid (none:
    the row's states stay as they were).
    S_n = exp(G_n) S_0 + sum over the path's nodes j of exp(G_n - G_j) k_j^T delta_j; the conv
    keeps the last `kernel` inputs of the cached ones followed by the path's.
    """
    device = record.keys.device
    paths, lengths = paths.to(device), lengths.to(device)
    width = paths.shape[1]
    on_path = torch.arange(width, device=device)[None, :] < lengths[:, None]  # (B, M)
    heads = record.keys.shape[1]
    node_index = paths[:, None, :].expand(-1, heads, -1)
    keys = record.keys.gather(2, node_index[..., None].expand(-1, -1, -1, record.keys.shape[-1]))
    deltas = record.deltas.gather(2, node_index[..., None].expand(-1, -1, -1, record.deltas.shape[-1]))
    decays = record.decays.gather(2, node_index)  # (B, heads, M)
    last = decays.gather(2, (lengths - 1).clamp(min=0)[:, None, None].expand(-1, heads, 1))  # (B, heads, 1)
    last = last.masked_fill((lengths == 0)[:, None, None], 0.0)  # a row that keeps no node keeps its states
    weights = (last - decays).masked_fill(~on_path[:, None, :], float("-inf")).exp()
    new_state = state.to(torch.float32) * last.exp()[..., None] + (keys * weights[..., None]).transpose(-1, -2) @ deltas
    kernel = conv.shape[-1]
    inputs = record.conv_inputs.gather(2, paths[:, None, :].expand(-1, record.conv_inputs.shape[1], -1))
    sequence = torch.cat([conv, inputs.to(conv.dtype)], dim=-1)
    window = (lengths[:, None] + torch.arange(kernel, device=device)[None, :])[:, None, :].expand(-1, conv.shape[1], -1)
    return new_state.to(state.dtype), sequence.gather(2, window)
