"""The model seen as a tree-verification target: `HFTarget` wraps a loaded image-text-to-text
model and offers what the decoding loop needs: prefill a batch of (image, prompt) inputs, run one
forward over a batch of token trees (its positions and attention mask), keep the accepted cache
entries, drop finished rows. The cache edits are cache.py's (kv_store.py's with the store on: a
cache written in place), the families' differences families/'s, plain `generate` generate.py's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
from PIL import Image

from .attention import tree_forward, use_hsd_attention
from .cache import BatchState, check_cache_layout, commit_linear_states, join_rows, keep_nodes, keep_rows
from .devices import DTYPES, default_device, default_dtype
from .families import IMAGE_FIRST, ChatLayout, FamilyAdapter, adapter_for
from ..repetition import NO_ALLOWANCE, RepetitionAllowance
from .generate import generate_plainly
from .generated_window import generated_window, hide_outside_window, window_hides
from .hybrid import linear_attention_layers, tree_form
from .kv_store import StoreConfig, StoreState, commit_stored, join_stored, keep_stored_rows, store_mask, stored


class HFTarget:
    """A transformers image-text-to-text model seen as a tree-verification target."""

    def __init__(
        self, model, processor, adapter: FamilyAdapter, layout: ChatLayout = IMAGE_FIRST, kv_store: StoreConfig | None = None,
    ):
        self.model = model
        # None: the rows' cache in transformers' DynamicCache, edited by cache.py; else in a
        # KVStore written in place (kv_store.py), taking memory as the config says.
        self.kv_store = kv_store
        self.processor = processor
        self.layout = layout  # the chat turns as the model's makers lay them out
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.adapter = adapter
        self.model_type: str = model.config.model_type
        self.device = model.device
        self.dtype = model.dtype
        # Unlimited-OCR's window over generated tokens (None: every token sees all before it).
        # Its cache is plain layers, not the evicting ones its config names: the masks hide what
        # the window leaves out (generated_window.py).
        self.window = generated_window(model.config)
        check_cache_layout(None if self.window else model.config)
        self.linear_layers = linear_attention_layers(model)  # a hybrid model's Gated DeltaNet layers
        self.stop_token_ids = adapter.stop_token_ids(model, self.tokenizer)
        self.vision_token_ids = adapter.vision_token_ids(model.config)
        self.hidden_token_ids = self._hidden_special_ids(adapter.text_special_tokens)

    # -- text --------------------------------------------------------------------------------

    def generate_plainly(
        self, image: Image.Image | None, prompt: str, max_new_tokens: int, repetition_guard: bool = False,
        allowance: RepetitionAllowance = NO_ALLOWANCE, **generate_kwargs,
    ) -> list[int]:
        """The output of transformers' own `generate` on this image and prompt (generate.py): what
        every speculative output must equal, and the speed it is measured against. `rules=` and
        `sampling=` (keywords) decode with those logits rules and that keyed sampling."""
        inputs = self.inputs([image], [prompt])
        return generate_plainly(
            self.model, inputs, self.stop_token_ids, max_new_tokens, repetition_guard, allowance, **generate_kwargs
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens and self.hidden_token_ids is not None:
            return self.tokenizer.decode([t for t in tokens if t not in self.hidden_token_ids], skip_special_tokens=False)
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    def _hidden_special_ids(self, markup: Sequence[str]) -> set[int] | None:
        """The special tokens that decoding leaves out where the family writes some as text
        (`markup`): every other one; None where it writes none (the tokenizer skips them all)."""
        vocabulary = self.tokenizer.get_vocab()
        kept = {vocabulary[token] for token in markup if token in vocabulary}
        if not kept:
            return None
        special = {i for i, token in self.tokenizer.added_tokens_decoder.items() if token.special}
        return (special | set(self.tokenizer.all_special_ids)) - kept

    def prompt_length(self, image: Image.Image | None, prompt: str) -> int:
        """The tokens of the prompt the model reads for (image, prompt), image tokens included."""
        batch = self.adapter.processor_inputs(self.processor, [image], [prompt], self.layout)
        return int(batch["input_ids"].shape[-1])

    def inputs(self, images: Sequence[Image.Image | None], prompts: Sequence[str]) -> dict:
        """Processor inputs for a batch (left padding so every row's next token is at the end)."""
        batch = self.adapter.processor_inputs(self.processor, images, prompts, self.layout)
        # Floating-point inputs (pixel values) in the model's dtype, as BatchFeature.to(device, dtype)
        # casts them: some vision towers (GOT-OCR 2.0's) do not cast them themselves.
        return {k: self._on_device(v) if torch.is_tensor(v) else v for k, v in batch.items()}

    def prompt_tokens(self, inputs: dict) -> list[list[int]]:
        """Each row's prompt ids in `inputs` (its padding left out): what `generate`'s logits
        processors see before the output (image placeholders included)."""
        ids, attention = inputs["input_ids"].cpu(), inputs["attention_mask"].bool().cpu()
        return [row[mask].tolist() for row, mask in zip(ids, attention)]

    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, self.dtype) if tensor.is_floating_point() else tensor.to(self.device)

    # -- decoding primitives -----------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, inputs: dict) -> tuple[BatchState | StoreState, torch.Tensor]:
        """Run the prompt (and images); return the state and the last-position logits (B, V)."""
        from transformers import DynamicCache

        cache = DynamicCache() if self.window else DynamicCache(config=self.model.config)
        position_ids, rope_delta = self.adapter.prefill_positions(self.model, inputs)
        out = self.model(**inputs, position_ids=position_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        attention = inputs["attention_mask"].bool().cpu()
        state = BatchState(
            cache=cache,
            slot_valid=attention.clone(),
            past_len=attention.sum(-1),
            rope_delta=rope_delta,
            rows=list(range(attention.shape[0])),
            prompt_len=attention.sum(-1),
        )
        return state if self.kv_store is None else stored(state, self.kv_store), out.logits[:, -1, :].float()

    @torch.inference_mode()
    def prefill_each(self, inputs: Sequence[dict]) -> tuple[BatchState, torch.Tensor]:
        """Prefill each single-row input alone and join the rows into one batch, left-padded like
        `prefill`'s: a page and its crops (prompts of very different lengths) then spend no prefill
        on padding."""
        parts = [self.prefill(row) for row in inputs]
        for index, (state, _) in enumerate(parts):
            state.rows = [index]
        return self.join([state for state, _ in parts]), torch.cat([logits for _, logits in parts])

    def join(self, states: Sequence[BatchState]) -> BatchState:
        """The rows of `states` (decoded apart so far) in one batch; each keeps its `rows`."""
        return join_stored(states) if isinstance(states[0], StoreState) else join_rows(states)

    @torch.inference_mode()
    def forward_tree(
        self,
        state: BatchState,
        tokens: torch.Tensor,
        depths: torch.Tensor,
        ancestors: torch.Tensor,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One forward over a padded batch of trees.

        tokens, depths: (B, K) long; ancestors: (B, K, K) bool, node i sees node j iff
        ancestors[b, i, j]; valid: (B, K) bool, False for padding nodes (None: every node is a
        tree's). Returns the fp32 logits of the valid nodes, row by row: (N, V).
        """
        width = tokens.shape[1]
        if isinstance(state, StoreState):
            state.store.open(width)
        positions = self._tree_positions(state, depths)
        visibility = self._tree_visibility(ancestors)
        # None where one token per row sees every slot (plain decoding of unpadded rows), as
        # `generate` then gives attention none: bf16 attention with a mask of zeros can round
        # differently from attention without one.
        plain = width == 1 and self._aligned(state) and bool(visibility.all()) and not self._window_hides(state, depths)
        padded = valid is not None and not bool(valid.all())
        with ExitStack() as scoped:
            scoped.enter_context(tree_forward())
            if padded:
                scoped.enter_context(self._output_layer_only_at(valid))
            # A one-token step is the layers' own: they update their states as `generate` does.
            if self.linear_layers and width > 1:
                state.linear_records = scoped.enter_context(self._linear_tree_form(visibility, depths))
            out = self.model(
                input_ids=tokens.to(self.device),
                position_ids=self.adapter.position_ids(self.model, positions).to(self.device),
                attention_mask=None if plain else self._mask(state, visibility, depths),
                past_key_values=state.cache,
                use_cache=True,
            )
        logits = out.logits
        if padded and logits.shape[:-1] == valid.shape:  # a model whose output layer is not its output embeddings module
            logits = logits[valid.to(self.device)]
        return logits.reshape(-1, logits.shape[-1]).float()

    @contextmanager
    def _output_layer_only_at(self, valid: torch.Tensor) -> Iterator[None]:
        """Within: the model's output layer computes the logits of the `valid` nodes only ((1, N, V)).
        No one reads a padding node's logits, and the output layer of a 150 k vocabulary is a large
        share of a small model's forward, and of the memory a step takes at many rows (logits are
        rows x nodes x vocabulary). vLLM, too, computes logits only where it samples."""
        head = self.model.get_output_embeddings()
        if head is None:
            yield
            return
        index = valid.reshape(-1).nonzero().squeeze(1).to(self.device)

        def valid_nodes(module: torch.nn.Module, args: tuple) -> tuple:
            hidden = args[0]
            return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)[None], *args[1:])

        handle = head.register_forward_pre_hook(valid_nodes)
        try:
            yield
        finally:
            handle.remove()

    def _aligned(self, state: BatchState | StoreState) -> bool:
        """Whether every row's cached slots are its own (no padding, no other row's longer entries)."""
        return state.store.aligned() if isinstance(state, StoreState) else bool(state.slot_valid.all())

    def _mask(self, state: BatchState | StoreState, visibility: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """The forward's additive mask: over the store's views (ragged rows), or the padded cache;
        less what a window over generated tokens leaves out."""
        if isinstance(state, StoreState):
            mask = store_mask(state.store.lengths, visibility, self.dtype, self.device)
        else:
            mask = self._additive_mask(state.slot_valid, visibility)
        return mask if self.window is None else self._windowed(state, mask, depths)

    def _window_hides(self, state: BatchState | StoreState, depths: torch.Tensor) -> bool:
        """Whether the window over generated tokens leaves out a token some node would see."""
        return self.window is not None and window_hides(state.past_len[:, None] + depths, state.prompt_len, self.window)

    def _windowed(self, state: BatchState | StoreState, mask: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """`mask` less the generated tokens each node's window leaves out (generated_window.py).
        The text index of a mask column: a cached slot's rank among its row's real slots (the
        store's rows have none but real ones), a tree node's the row's length plus its depth."""
        nodes = state.past_len[:, None] + depths  # (B, K) the nodes' text indices
        if isinstance(state, StoreState):
            lengths, width = state.store.lengths, depths.shape[1]
            offset = torch.arange(mask.shape[-1])[None, :] - lengths[:, None]  # slot - row length
            node_column = nodes.gather(1, offset.clamp(0, width - 1))
            columns = torch.where(offset < 0, offset + lengths[:, None], node_column)
        else:
            columns = torch.cat([state.slot_valid.long().cumsum(-1) - 1, nodes], dim=1)
        return hide_outside_window(mask, columns, nodes, state.prompt_len, self.window)

    def _additive_mask(self, slot_valid: torch.Tensor, visibility: torch.Tensor) -> torch.Tensor:
        """(B, 1, K, L + K) float mask in the model dtype (boolean 4-D masks are silently wrong
        with eager): 0 where a node sees a cached slot (`slot_valid`, (B, L)) or a tree node
        (`visibility`, (B, K, K)), the dtype's lowest elsewhere. Built on the device from those
        two, a row's slots converted once and copied to its K nodes (a host-built (B, K, L + K)
        mask costs a fill and a copy of every entry)."""
        rows, width, slots = visibility.shape[0], visibility.shape[1], slot_valid.shape[1]
        zero, lowest = torch.zeros((), dtype=self.dtype, device=self.device), torch.finfo(self.dtype).min
        mask = torch.empty((rows, 1, width, slots + width), dtype=self.dtype, device=self.device)
        mask[:, 0, :, :slots] = torch.where(slot_valid.to(self.device), zero, lowest)[:, None, :]
        mask[:, 0, :, slots:] = torch.where(visibility.to(self.device), zero, lowest)
        return mask

    # The tree's positions and mask, each in one method so that a test can subclass a wrong one
    # and check that the exactness tests notice.

    def _tree_positions(self, state: BatchState, depths: torch.Tensor) -> torch.Tensor:
        """(B, K) text positions of the tree nodes: after the row's real tokens, by depth."""
        return state.past_len[:, None] + depths + state.rope_delta[:, None]

    def _tree_visibility(self, ancestors: torch.Tensor) -> torch.Tensor:
        """(B, K, K) bool, which tree nodes each node attends to: its ancestors and itself."""
        return ancestors

    def _linear_tree_form(self, ancestors: torch.Tensor, depths: torch.Tensor):
        """The context in which a hybrid model's linear-attention layers read a tree (hybrid.py)."""
        return tree_form(self.linear_layers, ancestors, depths)

    def _linear_paths(self, kept_nodes: Sequence[Sequence[int]]) -> Sequence[Sequence[int]]:
        """The nodes whose states the linear-attention layers keep: the accepted path."""
        return kept_nodes

    def commit(self, state: BatchState, width: int, kept_nodes: Sequence[Sequence[int]]) -> None:
        """Keep, per row, the cache entries of `kept_nodes` (tree node indices) and the
        linear-attention states after them; drop the rest."""
        if isinstance(state, StoreState):
            commit_stored(state, kept_nodes)
        else:
            keep_nodes(state, kept_nodes, self.device)
        if state.linear_records is not None:
            commit_linear_states(state, self._linear_paths(kept_nodes))

    def keep_rows(self, state: BatchState, keep: Sequence[int]) -> None:
        """Drop finished rows from the batch (positions in the current batch to keep). With the
        store on, the rows kept may take another order: `state.rows` says which."""
        if isinstance(state, StoreState):
            keep_stored_rows(state, keep)
        else:
            keep_rows(state, keep, self.device)


def load_target(
    model: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    layout: ChatLayout = IMAGE_FIRST,
    kv_store: StoreConfig | None = None,
) -> HFTarget:
    """Load a model by hub id or local directory for speculative decoding. Its SDPA attention
    becomes hsd's (attention.py) unless `attn_implementation` names one."""
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
    if not attn_implementation:
        use_hsd_attention(network)  # SDPA's configs: tree forwards fold head groups (attention.py)
    return HFTarget(network, processor, adapter, layout, kv_store)
