"""The only module that knows transformers' cache, mask and position details.

`HFTarget` wraps a loaded image-text-to-text model and offers what the decoding loop needs:
prefill a batch of (image, prompt) inputs, run one forward over a batch of token trees, keep the
accepted cache entries, drop finished rows. Per-family details (MRoPE rope deltas, processors,
chat prompts, stop tokens) live in small `FamilyAdapter` classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX). Without it torch falls back
    to a reference kernel: bf16 matmuls measured 4 to 20 times slower than fp32 on an AMD EPYC
    without AVX512, while on a CPU with AVX512-BF16 they were up to 2 times faster."""
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def default_dtype(device: str) -> str:
    if device == "mps":
        return "float16"
    if device == "cpu" and not cpu_computes_bf16():
        return "float32"
    return "bfloat16"


# ----------------------------------------------------------------------------------------------
# Family adapters


def _image_only_processor_class(base: type) -> type:
    """A subclass of a Qwen-VL processor without the video processor (which needs torchvision)."""

    class ImageOnlyProcessor(base):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.vision_start_token = getattr(tokenizer, "vision_start_token", None) or "<|vision_start|>"
            self.vision_end_token = getattr(tokenizer, "vision_end_token", None) or "<|vision_end|>"
            for name in ("image_token", "video_token", "vision_start_token", "vision_end_token"):
                setattr(self, f"{name}_id", tokenizer.convert_tokens_to_ids(getattr(self, name)))
            # Skip the base __init__ (it wants a video processor) and go to ProcessorMixin's.
            super(base, self).__init__(image_processor, tokenizer, chat_template=chat_template)

    # Saved processor configs then name the official class, as in a real model directory.
    ImageOnlyProcessor.__name__ = base.__name__
    ImageOnlyProcessor.__qualname__ = f"{base.__name__}ImageOnly"
    return ImageOnlyProcessor


class FamilyAdapter:
    """What differs per model family. Subclasses are small; see `QwenVLAdapter`."""

    model_types: tuple[str, ...] = ()

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's `position_ids` and, per row, the rope delta: the offset added to
        (real tokens so far + depth) to get a new token's position. Left padding is skipped."""
        attention = inputs["attention_mask"].long()
        text_positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return self.position_ids(model, text_positions), torch.zeros(attention.shape[0], dtype=torch.long)

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, K) absolute text positions -> what the model's `position_ids` expects."""
        return positions

    def processor_images(self, images: Sequence[Image.Image | None]):
        """The images of a batch (None = a text-only row) as the processor takes them."""
        return [im for im in images if im is not None] or None

    def chat_text(self, processor, prompt: str, with_image: bool) -> str:
        content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": prompt}]
        messages = [{"role": "user", "content": content}]
        return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def vision_token_ids(self, config) -> list[int]:
        """Placeholder and delimiter tokens of images and videos (never real output)."""
        names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        return [getattr(config, n) for n in names if getattr(config, n, None) is not None]

    def stop_token_ids(self, model, tokenizer) -> list[int]:
        ids = model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)
        return ids


class QwenVLAdapter(FamilyAdapter):
    """Qwen2-VL and Qwen2.5-VL: MRoPE with 3 position rows and a per-sequence rope delta."""

    model_types = ("qwen2_vl", "qwen2_5_vl")

    def load_processor(self, path: str, trust_remote_code: bool):
        # Built from parts: AutoProcessor would also build the video processor, which needs
        # torchvision, and the default image processor backend needs it too.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        image_processor = self._image_processor_class().from_pretrained(path)
        template = _processor_chat_template(path) or tokenizer.chat_template
        return self._processor_class()(image_processor, tokenizer, chat_template=template)

    def new_processor(self, tokenizer, **image_settings):
        """A processor for a model built here (tiny random or replay): the family's processor
        classes around `tokenizer`, the image processor made with `image_settings`."""
        image_processor = self._image_processor_class()(**image_settings)
        return self._processor_class()(image_processor, tokenizer, chat_template=tokenizer.chat_template)

    def _processor_base(self) -> type:
        from transformers import Qwen2_5_VLProcessor

        return Qwen2_5_VLProcessor

    def _processor_class(self) -> type:
        return _image_only_processor_class(self._processor_base())

    def _image_processor_class(self) -> type:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs.get("image_grid_thw") is None:
            return super().prefill_positions(model, inputs)
        # Computed here, never read from model.model.rope_deltas: that attribute goes stale.
        positions, deltas = model.model.get_rope_index(
            inputs["input_ids"],
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs["image_grid_thw"],
            attention_mask=inputs["attention_mask"],
        )
        return positions, deltas.view(-1).cpu()

    def position_ids(self, model, positions: torch.Tensor) -> torch.Tensor:
        # Text tokens after the image use the same position on every MRoPE axis.
        return positions.unsqueeze(0).expand(self.rope_axes(model), -1, -1)

    def rope_axes(self, model) -> int:
        return 3


class Qwen2VLAdapter(QwenVLAdapter):
    model_types = ("qwen2_vl",)

    def _processor_base(self) -> type:
        from transformers import Qwen2VLProcessor

        return Qwen2VLProcessor


class Qwen25VLAdapter(QwenVLAdapter):
    model_types = ("qwen2_5_vl",)


class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL: interleaved MRoPE and deepstack vision features; the same position rule."""

    model_types = ("qwen3_vl",)

    def _processor_base(self) -> type:
        from transformers import Qwen3VLProcessor

        return Qwen3VLProcessor


class PaddleOCRVLAdapter(QwenVLAdapter):
    """PaddleOCR-VL: Qwen-style 3-axis MRoPE over an ERNIE text model; no video processor."""

    model_types = ("paddleocr_vl",)

    def _processor_class(self) -> type:
        from transformers import PaddleOCRVLProcessor

        return PaddleOCRVLProcessor

    def _image_processor_class(self) -> type:
        from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

        return PaddleOCRVLImageProcessorPil


class HunYuanVLAdapter(QwenVLAdapter):
    """HunYuanVL (HunyuanOCR): XD-RoPE with as many axes as `mrope_section` has entries (4 in
    HunyuanOCR); text tokens carry their sequence position on every axis."""

    model_types = ("hunyuan_vl",)

    def rope_axes(self, model) -> int:
        return len(model.config.text_config.rope_parameters["mrope_section"])

    def prefill_positions(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        # transformers numbers images across the whole batch on the image-index axis: a row's
        # image would get its batch position as index, and other logits than decoded alone.
        if inputs.get("image_grid_thw") is None or inputs["input_ids"].shape[0] == 1:
            return super().prefill_positions(model, inputs)
        images_per_row = (inputs["input_ids"] == model.config.im_start_id).sum(-1).tolist()
        grids = inputs["image_grid_thw"].split(images_per_row)
        rows = [
            super(HunYuanVLAdapter, self).prefill_positions(model, {
                "input_ids": inputs["input_ids"][b : b + 1],
                "mm_token_type_ids": inputs["mm_token_type_ids"][b : b + 1],
                "attention_mask": inputs["attention_mask"][b : b + 1],
                "image_grid_thw": grid if len(grid) else None,
            })
            for b, grid in enumerate(grids)
        ]
        return torch.cat([positions for positions, _ in rows], dim=1), torch.cat([deltas for _, deltas in rows])

    def vision_token_ids(self, config) -> list[int]:
        return [config.image_token_id, config.im_start_id, config.im_end_id, config.im_newline_id]

    def _processor_class(self) -> type:
        from transformers import HunYuanVLProcessor

        return HunYuanVLProcessor

    def _image_processor_class(self) -> type:
        from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil

        return HunYuanVLImageProcessorPil


class Idefics3Adapter(FamilyAdapter):
    """Idefics3 (SmolVLM, SmolDocling, granite-docling): plain 1-D positions over a Llama-style
    text model; images are given per prompt."""

    model_types = ("idefics3",)

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer, Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config_file = _model_file(path, "processor_config.json")
        settings = json.loads(config_file.read_text()) if config_file is not None else {}
        template = _processor_chat_template(path) or tokenizer.chat_template
        return Idefics3Processor(
            Idefics3ImageProcessorPil.from_pretrained(path),
            tokenizer,
            image_seq_len=settings.get("image_seq_len", 169),
            chat_template=template,
        )

    def processor_images(self, images: Sequence[Image.Image | None]):
        return [[im] if im is not None else [] for im in images] if any(im is not None for im in images) else None


ADAPTERS: dict[str, FamilyAdapter] = {
    t: a
    for a in (
        Qwen2VLAdapter(), Qwen25VLAdapter(), Qwen3VLAdapter(), PaddleOCRVLAdapter(), HunYuanVLAdapter(), Idefics3Adapter()
    )
    for t in a.model_types
}


def adapter_for(model_type: str) -> FamilyAdapter:
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise ValueError(f"model family {model_type!r} is not supported; supported: {sorted(ADAPTERS)}") from None


def _model_file(path: str, name: str) -> Path | None:
    """A file of a local model directory or hub repository (downloaded), or None if absent."""
    from transformers.utils import cached_file

    found = cached_file(path, name, _raise_exceptions_for_missing_entries=False)
    return Path(found) if found else None


def _processor_chat_template(path: str) -> str | None:
    """The processor-level chat template (Qwen-VL repositories keep it outside the tokenizer)."""
    for name in ("chat_template.jinja", "chat_template.json"):
        file = _model_file(path, name)
        if file is not None:
            text = file.read_text()
            return json.loads(text)["chat_template"] if name.endswith(".json") else text
    return None


# ----------------------------------------------------------------------------------------------
# The target model


@dataclass
class BatchState:
    """Cache and bookkeeping for the rows being decoded. Slots of the cache can be padding."""

    cache: object
    slot_valid: torch.Tensor  # (B, L) bool, which cache slots hold real tokens
    past_len: torch.Tensor  # (B,) long, real tokens in the cache per row (= next text position)
    rope_delta: torch.Tensor  # (B,) long
    rows: list[int]  # the caller's index of each row still in the batch


# generation_config fields that change which token `generate` picks even with do_sample=False.
# Checkpoints set some (Qwen's ship repetition_penalty 1.05), which would make a greedy
# `generate` something other than the plain argmax decoding that speculation must equal.
_LOGIT_SHAPING_FIELDS = (
    "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "min_length", "min_new_tokens", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
    "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty",
)


def plain_generate_overrides(model) -> dict:
    """`generate` keyword arguments that undo the checkpoint's logit shaping (each field at the
    library default where the checkpoint sets another), so greedy `generate` is plain argmax."""
    from transformers import GenerationConfig

    library = GenerationConfig()
    own = model.generation_config
    return {
        name: getattr(library, name)
        for name in _LOGIT_SHAPING_FIELDS
        if getattr(own, name, None) != getattr(library, name, None)
    }


class _RepetitionStop:
    """hsd's repetition guard as a `generate` stopping criterion (a callable is all `generate`
    asks of one), so that plain decoding stops where hsd's loop stops."""

    def __init__(self, prompt_length: int) -> None:
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        from .repetition import REPETITION_SPAN, repetition_stop

        # Earlier calls saw every shorter output: only a loop ending at the newest token is new.
        recent = input_ids[0, max(self.prompt_length, input_ids.shape[1] - REPETITION_SPAN):].tolist()
        looping = repetition_stop(recent) == len(recent)
        return torch.full((input_ids.shape[0],), looping, dtype=torch.bool, device=input_ids.device)


class HFTarget:
    """A transformers image-text-to-text model seen as a tree-verification target."""

    def __init__(self, model, processor, adapter: FamilyAdapter):
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.adapter = adapter
        self.model_type: str = model.config.model_type
        self.device = model.device
        self.dtype = model.dtype
        check_cache_layout(model.config)
        self.stop_token_ids = adapter.stop_token_ids(model, self.tokenizer)
        self.vision_token_ids = adapter.vision_token_ids(model.config)

    # -- text --------------------------------------------------------------------------------

    def generate_plainly(
        self, image: Image.Image | None, prompt: str, max_new_tokens: int, repetition_guard: bool = False,
        **generate_kwargs,
    ) -> list[int]:
        """The output of transformers' own `generate`: greedy, without the checkpoint's logit
        shaping, ending where hsd's loop ends (a stop token, the budget, the repetition guard).
        What every speculative output must equal, and the speed it is measured against."""
        from transformers import StoppingCriteriaList

        inputs = self.inputs([image], [prompt])
        prompt_length = inputs["input_ids"].shape[1]
        stops = [_RepetitionStop(prompt_length)] if repetition_guard else []
        out = self.model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.stop_token_ids,
            stopping_criteria=StoppingCriteriaList(stops), **{**plain_generate_overrides(self.model), **generate_kwargs},
        )
        return out[0, prompt_length:].tolist()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    def inputs(self, images: Sequence[Image.Image | None], prompts: Sequence[str]) -> dict:
        """Processor inputs for a batch (left padding so every row's next token is at the end)."""
        texts = [self.adapter.chat_text(self.processor, p, im is not None) for im, p in zip(images, prompts)]
        batch = self.processor(
            text=texts, images=self.adapter.processor_images(images), return_tensors="pt", padding=True, padding_side="left"
        )
        return {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    # -- decoding primitives -----------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, inputs: dict) -> tuple[BatchState, torch.Tensor]:
        """Run the prompt (and images); return the state and the last-position logits (B, V)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        position_ids, rope_delta = self.adapter.prefill_positions(self.model, inputs)
        out = self.model(**inputs, position_ids=position_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        attention = inputs["attention_mask"].bool().cpu()
        state = BatchState(
            cache=cache,
            slot_valid=attention.clone(),
            past_len=attention.sum(-1),
            rope_delta=rope_delta,
            rows=list(range(attention.shape[0])),
        )
        return state, out.logits[:, -1, :].float()

    @torch.inference_mode()
    def prefill_each(self, inputs: Sequence[dict]) -> tuple[BatchState, torch.Tensor]:
        """Prefill each single-row input alone and join the rows into one batch, left-padded like
        `prefill`'s: a page and its crops (prompts of very different lengths) then spend no prefill
        on padding."""
        parts = [self.prefill(row) for row in inputs]
        length = max(state.slot_valid.shape[1] for state, _ in parts)

        def left_padded(tensor: torch.Tensor) -> torch.Tensor:  # (1, heads, slots, head_dim)
            return torch.nn.functional.pad(tensor, (0, 0, length - tensor.shape[2], 0))

        joined = parts[0][0]
        for index, layer in enumerate(joined.cache.layers):
            layer.keys = torch.cat([left_padded(state.cache.layers[index].keys) for state, _ in parts])
            layer.values = torch.cat([left_padded(state.cache.layers[index].values) for state, _ in parts])
        joined.slot_valid = torch.cat(
            [torch.nn.functional.pad(state.slot_valid, (length - state.slot_valid.shape[1], 0), value=False) for state, _ in parts]
        )
        joined.past_len = torch.cat([state.past_len for state, _ in parts])
        joined.rope_delta = torch.cat([state.rope_delta.reshape(-1) for state, _ in parts])
        joined.rows = list(range(len(parts)))
        return joined, torch.cat([logits for _, logits in parts])

    @torch.inference_mode()
    def forward_tree(
        self,
        state: BatchState,
        tokens: torch.Tensor,
        depths: torch.Tensor,
        ancestors: torch.Tensor,
    ) -> torch.Tensor:
        """One forward over a padded batch of trees.

        tokens, depths: (B, K) long; ancestors: (B, K, K) bool, node i sees node j iff
        ancestors[b, i, j]. Returns fp32 logits (B, K, V).
        """
        width = tokens.shape[1]
        positions = self._tree_positions(state, depths)
        visible = torch.cat([state.slot_valid[:, None, :].expand(-1, width, -1).cpu(), self._tree_visibility(ancestors)], dim=-1)
        # Float additive mask in the model dtype: boolean 4-D masks are silently wrong with eager.
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, torch.finfo(self.dtype).min)
        out = self.model(
            input_ids=tokens.to(self.device),
            position_ids=self.adapter.position_ids(self.model, positions).to(self.device),
            attention_mask=mask[:, None].to(self.device),
            past_key_values=state.cache,
            use_cache=True,
        )
        return out.logits.float()

    # The tree's positions and mask, each in one method so that a test can subclass a wrong one
    # and check that the exactness tests notice.

    def _tree_positions(self, state: BatchState, depths: torch.Tensor) -> torch.Tensor:
        """(B, K) text positions of the tree nodes: after the row's real tokens, by depth."""
        return state.past_len[:, None] + depths + state.rope_delta[:, None]

    def _tree_visibility(self, ancestors: torch.Tensor) -> torch.Tensor:
        """(B, K, K) bool, which tree nodes each node attends to: its ancestors and itself."""
        return ancestors

    def commit(self, state: BatchState, width: int, kept_nodes: Sequence[Sequence[int]]) -> None:
        """Keep, per row, the cache entries of `kept_nodes` (tree node indices) and drop the rest.

        The forward appended `width` slots to every row. They are replaced by `m` slots (m = the
        longest kept list): row b's kept entries, then padding. Accepted chains are prefixes of
        the new slots, so usually this is a slice and copies nothing.
        """
        old_len = state.slot_valid.shape[1]
        kept_count = torch.tensor([len(nodes) for nodes in kept_nodes])
        longest = int(kept_count.max())
        if all(list(nodes) == list(range(len(nodes))) for nodes in kept_nodes):
            _edit_cache(state, lambda slots: slots[:, :, : old_len + longest])
        else:
            index = torch.tensor([list(nodes) + [0] * (longest - len(nodes)) for nodes in kept_nodes])
            self._gather_new_slots(state, old_len, index)
        new_valid = torch.arange(longest)[None, :] < kept_count[:, None]
        state.slot_valid = torch.cat([state.slot_valid, new_valid], dim=1)
        state.past_len = state.past_len + kept_count
        if state.slot_valid.shape[0] > 1 and (~state.slot_valid).sum() * 2 > state.slot_valid.numel():
            self._compact(state)

    def _gather_new_slots(self, state: BatchState, old_len: int, index: torch.Tensor) -> None:
        """Keep the first `old_len` slots and, after them, the new slots at `index` (B, M)."""
        device_index = index.to(self.device)
        _edit_cache(state, lambda slots: torch.cat([slots[:, :, :old_len], _gather_slots(slots[:, :, old_len:], device_index)], dim=2))

    def _compact(self, state: BatchState) -> None:
        """Squeeze out padding slots: every row's real slots move to the right end, in order."""
        valid = state.slot_valid
        new_len = int(valid.sum(-1).max())
        # A stable sort puts padding first and real slots in their original order last.
        order = torch.sort(valid.to(torch.int8), dim=-1, stable=True).indices[:, -new_len:]
        device_order = order.to(self.device)
        _edit_cache(state, lambda slots: _gather_slots(slots, device_order))
        state.slot_valid = torch.gather(valid, 1, order)

    def keep_rows(self, state: BatchState, keep: Sequence[int]) -> None:
        """Drop finished rows from the batch (positions in the current batch to keep)."""
        index = torch.tensor(list(keep), dtype=torch.long)
        device_index = index.to(self.device)
        valid = state.slot_valid[index]
        trim = int((~valid).all(0).long().cumprod(0).sum())  # leading all-padding columns
        _edit_cache(state, lambda slots: slots.index_select(0, device_index)[:, :, trim:])
        state.slot_valid = valid[:, trim:]
        state.past_len = state.past_len[index]
        state.rope_delta = state.rope_delta[index]
        state.rows = [state.rows[i] for i in keep]


def _gather_slots(slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per row b, the slots index[b] (B, M) of a (B, heads, slots, head_dim) cache tensor."""
    return slots.gather(2, index[:, None, :, None].expand(-1, slots.shape[1], -1, slots.shape[-1]))


def _edit_cache(state: BatchState, edit: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every layer's keys and values (B, heads, slots, head_dim) with `edit` of them."""
    for layer in state.cache.layers:
        layer.keys = edit(layer.keys)
        layer.values = edit(layer.values)


# ----------------------------------------------------------------------------------------------
# The transformers versions this module knows

# This module edits DynamicCache's per-layer tensors directly (above), which transformers does not
# promise to keep stable: it is tested with these versions only.
SUPPORTED_TRANSFORMERS = ">=5.23,<5.24"


class UnsupportedTransformersError(RuntimeError):
    """The installed transformers keeps its KV cache in a layout this module does not know."""


def cache_layout_problem(config=None) -> str | None:
    """How the installed transformers' KV cache differs from the layout this module edits, or
    None: a DynamicCache (made for `config` if given) of plain DynamicLayer objects whose `keys`
    and `values` tensors (batch, heads, slots, head_dim) grow along dim 2, and whose length is
    read back from those tensors after they are edited."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError as exc:
        return f"transformers.cache_utils has no DynamicCache or DynamicLayer ({exc})"
    cache = DynamicCache()
    first, second = torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 1, 4)
    for step in (first, second):
        cache.update(step, step, 0)
    layers = getattr(cache, "layers", None)
    if not layers or type(layers[0]) is not DynamicLayer:
        return "DynamicCache does not keep its entries in a list of DynamicLayer objects (`.layers`)"
    layer = layers[0]
    expected = torch.cat([first, second], dim=2)
    for name in ("keys", "values"):
        held = getattr(layer, name, None)
        if not torch.is_tensor(held) or held.shape != expected.shape or not torch.equal(held, expected):
            return f"DynamicLayer.{name} is not the (batch, heads, slots, head_dim) tensor of the entries so far"
    layer.keys, layer.values = layer.keys[:, :, :2], layer.values[:, :, :2]
    if cache.get_seq_length() != 2:
        return "DynamicCache does not read its length from the layers' key tensors"
    if config is not None:
        kinds = sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers})
        if kinds != [DynamicLayer.__name__]:
            return f"the model's cache layers are {kinds}, not plain {DynamicLayer.__name__}s (sliding-window attention is not supported)"
    return None


def check_cache_layout(config=None) -> None:
    """Raise UnsupportedTransformersError (one line, naming the supported versions) if the
    installed transformers' cache layout is not the known one."""
    import transformers

    problem = cache_layout_problem(config)
    if problem is not None:
        raise UnsupportedTransformersError(
            f"hsd's decoder does not know the KV cache of the installed transformers {transformers.__version__}: "
            f"{problem}; it is tested with transformers{SUPPORTED_TRANSFORMERS} (pip install 'transformers{SUPPORTED_TRANSFORMERS}')"
        )


# ----------------------------------------------------------------------------------------------
# Loading


def load_target(
    model: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> HFTarget:
    """Load a model by hub id or local directory for speculative decoding."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    check_cache_layout()  # before loading any weights
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    adapter = adapter_for(config.model_type)
    processor = adapter.load_processor(model, trust_remote_code)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    network = AutoModelForImageTextToText.from_pretrained(
        model, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **kwargs
    )
    network.to(device).eval()
    return HFTarget(network, processor, adapter)
