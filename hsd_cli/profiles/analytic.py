"""An analytic profile: what a forward and a prefill cost on a device that is not present,
computed from the device's published memory bandwidth and FLOP/s and the model's shapes
(formulas in docs/method.md, "Cost profiles")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from time import perf_counter
from typing import TYPE_CHECKING, Any

from hsd_cli.profiles import DeviceMemory, ForwardCost, HostCost, PrefillCost, Profile
from hsd_cli.decoding.layer_mix import LinearAttention, attention_layers

if TYPE_CHECKING:  # issue.py measures with torch, which the CLI's parent process never imports
    from hsd_cli.profiles.issue import IssueCost

# Continuous batching holds hundreds of rows on a GPU, and the load sizer prices every width.
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
NODES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (512, 2048, 4096, 8192)
IMAGE_SIDES = (224, 448, 896, 1344, 1792, 2240)
# The host work of hsd's loop around a forward (Python: proposing, the tree batch, reading the path
# back, the cache edits), as `hsd profile`'s host runs measure it around a tiny model's forwards on
# this project's CPU, one thread, at 1, 8, 64 and 256 rows, with the in-place KV store a GPU runs
# (ModelConfig.kv_store_slots) and the step clock on the thread's CPU time (other work on the
# machine then does not count): per coefficient the median of three fits after the step's host
# work was laid out per batch (docs/BENCHMARKS.md, "Host work and the cost of a step"; the fit
# before, 0.495 ms, 4.69 us and 2.03 us, was without the store). It keeps the CPU's argmax over the
# nodes' logits, which a GPU computes on the device: the CPU that drives a GPU runs the rest.
LOOP_HOST = HostCost(per_step=0.000221, per_row=0.0000023, per_node=0.00000138)


@dataclass(frozen=True)
class DeviceSpec:
    """Published peak figures of a device; the efficiencies are what decoding kernels reach of them."""

    name: str
    memory_bandwidth: float  # bytes/s
    peak_flops: float  # dense FLOP/s in `dtype`
    dtype: str
    memory_bytes: int | None = None  # what the rows' caches share with the weights; None: unbounded
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.6
    # The device's idle time between a forward's kernels, paid by a captured graph's replay too (the
    # host's issue time, which eager forwards add, is measured apart: profiles/issue.py).
    kernel_gaps_s: float = 0.001


GIB = 1 << 30
DEVICES = {
    "h100-bf16": DeviceSpec("NVIDIA H100 SXM", 3.35e12, 989e12, "bfloat16", 80 * GIB),
    # The H100's compute with more and faster memory (HBM3e): 141 GB at 4.8 TB/s.
    "h200-bf16": DeviceSpec("NVIDIA H200 SXM", 4.8e12, 989e12, "bfloat16", 141 * GIB),
    "a100-bf16": DeviceSpec("NVIDIA A100 SXM 80GB", 2.039e12, 312e12, "bfloat16", 80 * GIB),
    "l4-bf16": DeviceSpec("NVIDIA L4", 300e9, 121e12, "bfloat16", 24 * GIB),
}
# The chunk of the chunked gated delta rule a prefill runs (transformers' and fla's chunk size).
PREFILL_CHUNK = 64
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The analytic model fed with what this machine's CPU measures (not published figures): to check
# the formulas against a measured profile of the same model here.
THIS_CPU = "this-cpu-float32"


def measure_this_cpu(repeats: int = 3) -> DeviceSpec:
    """This CPU's reachable read bandwidth (summing a 1 GiB tensor) and fp32 matmul FLOP/s (2048^3),
    with torch's threads; efficiencies 1 since these are reached, not peak, figures."""
    import torch

    values = torch.ones(2**28)
    left, right = torch.randn(2048, 2048), torch.randn(2048, 2048)

    def timed(work: Any) -> float:
        work()
        started = perf_counter()
        work()
        return perf_counter() - started

    read_s = min(timed(values.sum) for _ in range(repeats))
    matmul_s = min(timed(lambda: left @ right) for _ in range(repeats))
    return DeviceSpec(
        f"this CPU ({torch.get_num_threads()} threads)", values.numel() * 4 / read_s, 2 * 2048**3 / matmul_s, "float32",
        bandwidth_efficiency=1.0, flops_efficiency=1.0,
    )


# What `ModelShape.of` reads of a text config and of a vision config.
DENSE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
VISION_KEYS = ("hidden_size", "intermediate_size", "depth", "patch_size")


@dataclass(frozen=True)
class ModelShape:
    """What the analytic cost needs of a model's config."""

    text_params: int  # read once per forward: every decoder layer, the embedding and the output layer
    kv_bytes_per_token: int  # keys and values of the attention layers, per cached token (at 1 byte per value)
    vision_params: int
    vision_hidden: int
    vision_full_layers: int  # vision layers attending over the whole picture
    vision_window_layers: int  # vision layers attending within windows of `window_patches`
    window_patches: int
    patch: int
    merge: int
    attention_layers: int  # the decoder layers that attend over the context (a hybrid's full-attention ones)
    attention_width: int  # query heads x head_dim: the width of a query's dot products with the context
    linear: LinearAttention | None = None  # a hybrid's Gated DeltaNet layers: a fixed state per row, work per node

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModelShape:
        text = config.get("text_config") or config
        if text.get("num_experts"):
            raise ValueError(f"{config.get('model_type')}'s text model is a mixture of experts: analytic profiles price dense "
                             "decoders (a measured profile prices any: hsd profile --model)")
        vision = config.get("vision_config") or {}
        missing = [key for key in DENSE_KEYS if key not in text] + [f"vision {key}" for key in VISION_KEYS if key not in vision]
        if missing:
            raise ValueError(f"the config lacks {', '.join(missing)}: analytic profiles price Qwen-VL-style configs")
        hidden, layers, ffn = text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"]
        heads, kv_heads = text["num_attention_heads"], text["num_key_value_heads"]
        head_dim = text.get("head_dim") or hidden // heads
        linear = LinearAttention.of(text)
        full_layers = attention_layers(text)
        # Qwen3.5's attention gates its output with a second query-sized projection.
        gate = text.get("attn_output_gate", config.get("model_type", "").startswith("qwen3_5"))
        attention = (2 + gate) * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        mixing = full_layers * attention + (linear.layers * linear.layer_params(hidden) if linear else 0)
        embeddings = text["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
        v_hidden, v_ffn, v_depth = vision["hidden_size"], vision["intermediate_size"], vision["depth"]
        merge = vision.get("spatial_merge_size", 2)
        merger = (v_hidden * merge**2) ** 2 + v_hidden * merge**2 * vision.get("out_hidden_size", hidden)
        # The patch embedding (a conv over 2 frames of a patch) and Qwen3.5's learned position table.
        embedding = (3 * vision.get("temporal_patch_size", 2) * vision["patch_size"] ** 2
                     + vision.get("num_position_embeddings", 0)) * v_hidden
        # Qwen2.5-VL's encoder has a gated MLP (three matrices), Qwen3.5's and Qwen2-VL's two.
        v_mlp = (3 if config.get("model_type") == "qwen2_5_vl" else 2) * v_hidden * v_ffn
        # Qwen2.5-VL's encoder attends within 112-pixel windows but in its `fullatt_block_indexes`.
        window = vision.get("window_size")
        v_full_layers = len(vision["fullatt_block_indexes"]) if window else v_depth
        return cls(
            text_params=mixing + layers * 3 * hidden * ffn + embeddings,
            kv_bytes_per_token=2 * full_layers * kv_heads * head_dim,
            vision_params=v_depth * (4 * v_hidden**2 + v_mlp) + merger + embedding,
            vision_hidden=v_hidden,
            vision_full_layers=v_full_layers,
            vision_window_layers=v_depth - v_full_layers,
            window_patches=(window // vision["patch_size"]) ** 2 if window else 0,
            patch=vision["patch_size"],
            merge=merge,
            attention_layers=full_layers,
            attention_width=heads * head_dim,
            linear=linear,
        )

    def state_bytes_per_row(self, width: int) -> int:
        """A row's fixed state (a hybrid's linear layers), `width` bytes a value in the model."""
        return self.linear.state_bytes_per_row(width) if self.linear else 0

    def linear_flops(self, rows: int, nodes: int) -> float:
        """The linear layers' work over `rows` trees of `nodes` each (none without them)."""
        return rows * self.linear.tree_flops(nodes) if self.linear else 0.0


def analytic_forward_s(shape: ModelShape, device: DeviceSpec, rows: int, nodes: int, context: int) -> float:
    """max(memory time, compute time) + the gaps between kernels: the device's time; the weights and the rows' caches are read once
    (a hybrid's linear-layer states read by the tree form and written by the commit); every node
    costs 2 FLOPs per weight, attention over its row's context in the full-attention layers and
    the linear layers' work per tree node (`LinearAttention.tree_flops`)."""
    width = _DTYPE_BYTES[device.dtype]
    read = (shape.text_params * width + rows * (context + nodes) * shape.kv_bytes_per_token * width
            + rows * 2 * shape.state_bytes_per_row(width))
    attention = 4 * shape.attention_layers * shape.attention_width * rows * nodes * (context + nodes)
    flops = 2 * shape.text_params * rows * nodes + attention + shape.linear_flops(rows, nodes)
    memory_s = read / (device.memory_bandwidth * device.bandwidth_efficiency)
    compute_s = flops / (device.peak_flops * device.flops_efficiency)
    return max(memory_s, compute_s) + device.kernel_gaps_s


def analytic_prefill_s(shape: ModelShape, device: DeviceSpec, image_side: int, prompt_tokens: int = 40) -> tuple[int, float]:
    """(tokens, seconds) of a page's prefill: the vision encoder over the patches (its attention
    over the whole picture in its full-attention layers, within windows in the others), then the
    prompt with the merged image tokens through the decoder (a hybrid's linear layers by the
    chunked rule, in chunks of PREFILL_CHUNK tokens); compute-bound."""
    patches = (image_side // shape.patch) ** 2
    tokens = patches // shape.merge**2 + prompt_tokens
    vision_attention = 4 * shape.vision_hidden * patches * (
        shape.vision_full_layers * patches + shape.vision_window_layers * shape.window_patches
    )
    chunks = -(-tokens // PREFILL_CHUNK)
    flops = (2 * shape.vision_params * patches + vision_attention + 2 * shape.text_params * tokens
             + 4 * shape.attention_layers * shape.attention_width * tokens**2 + shape.linear_flops(chunks, PREFILL_CHUNK))
    compute_s = flops / (device.peak_flops * device.flops_efficiency)
    memory_s = (shape.text_params + shape.vision_params) * _DTYPE_BYTES[device.dtype] / (device.memory_bandwidth * device.bandwidth_efficiency)
    return tokens, max(compute_s, memory_s) + 2 * device.kernel_gaps_s


def analytic_profile(device_name: str, architecture: str, config: dict[str, Any], issue: IssueCost) -> Profile:
    """The profile of `config` on the device; `issue`: what an eager forward of it costs the host
    (`measure_issue`). A GPU's host issues while the device runs (`Profile.issue_s`); this CPU
    issues its own work between ops (no launches), so there the dispatch adds to every forward."""
    shape = ModelShape.of(config)
    if device_name == THIS_CPU:
        device, issue_s = replace(measure_this_cpu(), kernel_gaps_s=issue.dispatch_s), 0.0
    else:
        device, issue_s = DEVICES[device_name], issue.seconds
    forwards = tuple(
        ForwardCost(r, n, c, analytic_forward_s(shape, device, r, n, c)) for c in CONTEXTS for r in ROWS for n in NODES
    )
    prefills = tuple(PrefillCost(side, *analytic_prefill_s(shape, device, side)) for side in IMAGE_SIDES)
    return Profile(
        name=f"{architecture}-{device_name}", model=architecture, device=device.name, dtype=device.dtype,
        kind="analytic", forwards=forwards, prefills=prefills, host=LOOP_HOST, memory=device_memory(shape, device),
        issue_s=issue_s,
    )


def device_memory(shape: ModelShape, device: DeviceSpec) -> DeviceMemory | None:
    width = _DTYPE_BYTES[device.dtype]
    if device.memory_bytes is None:
        return None
    return DeviceMemory(
        device.memory_bytes, (shape.text_params + shape.vision_params) * width, shape.kv_bytes_per_token * width,
        shape.state_bytes_per_row(width),
    )
