"""What a model's makers feed it and do with its answer, as plain data.

A `Recipe` says, for one model, how its makers run it: how a page becomes pixels (`Render`), what
their client does to those pixels before the processor sees them (`ClientResize`), the processor's
own limits (`ProcessorLimits`), the chat messages (`Prompt`), the decoding rules (`Decoding`), when
they read a page again (`RetryPolicy`) and what they do with the text (`Output`). Every field is
data: the functions that apply it are in `sizes`, `messages` and `postprocess`, and the decoding
core reads the rules from here without importing this package.
"""

from __future__ import annotations

from dataclasses import dataclass

from hsd_cli.records.kinds import BlockKind

# Renderers by the makers' tool: hsd renders with PyMuPDF; the others name what the makers use
# (pdftoppm: poppler's, as olmOCR calls it; pypdfium2: Chandra's, PaddleX's).
RENDERERS = ("pymupdf", "pdftoppm", "pypdfium2")
# How the render scale is chosen (sizes.render_size gives the pixels for each):
# longest_side: the longest side is `longest_side_px` (olmOCR: pdftoppm -r target*72/longest);
# dpi: `dpi`, lowered so that width * height <= `max_pixels` when that is set (hsd's rule);
# dpi_min_side: `dpi`, raised so the shortest side is at least `min_side_px` (Chandra);
# dpi_max_side: `dpi`, lowered so the longest side is at most `longest_side_px` (GLM-OCR).
SIZE_RULES = ("longest_side", "dpi", "dpi_min_side", "dpi_max_side")
# Who picks the prompt's page text: olmOCR-0225's "pdfreport" anchor (olmocr.prompts.anchor).
ANCHOR_ENGINES = ("olmocr_pdfreport",)
# When the makers read a page again (RetryPolicy.retry_when):
RETRY_REASONS = (
    "out_of_budget",  # the answer hit the token budget (finish_reason != "stop")
    "over_context",  # prompt + answer longer than the makers' context limit
    "unparsable",  # the front matter or JSON does not parse into the makers' page record
    "rotation_invalid",  # the model says the page is rotated: read it again turned
    "repeats",  # the makers' repeat detector fires on the answer
)
# What stands in for a page the retries could not read:
FALLBACKS = (
    "text_layer",  # the PDF's text layer (olmOCR: pdftotext)
    "drop_page",  # nothing: the page is left out of the document (DeepSeek-OCR-2 without EOS)
    "last_answer",  # the last answer as it is (Chandra keeps its last retry)
    "draft",  # hsd's own: the page's draft stands in (the repetition guard)
)


@dataclass(frozen=True)
class Render:
    renderer: str  # one of RENDERERS
    rule: str  # one of SIZE_RULES
    longest_side_px: int | None = None
    dpi: float | None = None
    max_pixels: int | None = None  # hsd's cap on the render (--max-pixels)
    min_side_px: int | None = None
    flatten_forms: bool = False  # form fields and annotations drawn into the page (Chandra)
    # How the makers hand the pixels over: "png" (lossless), "jpeg" (GLM-OCR re-encodes), or
    # "pil" (a PIL image straight to the processor, no encoding).
    encoding: str = "png"


@dataclass(frozen=True)
class ClientResize:
    """A resize the makers' client does before the processor (Chandra's scale_to_fit)."""

    max_size: tuple[int, int]  # (width, height): at most max_size[0] * max_size[1] pixels
    min_size: tuple[int, int]  # at least min_size[0] * min_size[1] pixels
    grid_px: int | None  # sides rounded to a multiple of this (None: floor/ceil of the scale)
    resample: str  # PIL filter name: "lanczos"


@dataclass(frozen=True)
class ProcessorLimits:
    """The image processor's rule (Qwen2-VL's smart_resize and its kin): sides rounded to
    `patch_px * merge` and the area kept within [min_pixels, max_pixels]."""

    patch_px: int
    merge: int
    min_pixels: int
    max_pixels: int
    resample: str  # the processor's filter: "bicubic" for Qwen2-VL's

    @property
    def grid_px(self) -> int:
        return self.patch_px * self.merge


@dataclass(frozen=True)
class AnchorText:
    engine: str  # one of ANCHOR_ENGINES
    max_chars: int


@dataclass(frozen=True)
class Prompt:
    text: str
    # The user turn's parts in order: ("text", "image") as olmOCR sends them, or ("image", "text").
    order: tuple[str, ...]
    # None: no system turn, the chat template's default applies (Qwen2-VL's writes "You are a
    # helpful assistant."); "" is a system turn with empty content (HunyuanOCR sends one).
    system: str | None = None
    anchor: AnchorText | None = None  # the page's text, put into `text` at {anchor}


@dataclass(frozen=True)
class NgramBan:
    """DeepSeek's no-repeat-n-gram rule: a token that would repeat an n-gram of the last `window`
    tokens is banned, except the `allowed` ones (table cell tags)."""

    n: int
    window: int
    allowed: tuple[str, ...]  # token strings: ids differ per tokenizer


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    # Stop tokens by their strings, beyond the tokenizer's EOS (Chandra adds <|im_end|>).
    stop: tuple[str, ...] = ()
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # vLLM's, over the answer's tokens (MinerU2.5)
    frequency_penalty: float = 0.0
    ngram_ban: NgramBan | None = None
    skip_special_tokens: bool = True  # False: the answer keeps its special tokens (DeepSeek's EOS)


@dataclass(frozen=True)
class RetryPolicy:
    """The makers' reads of a page after the first: attempt k (0 the first) decodes at
    `temperatures[min(k, len - 1)]` and `top_ps[min(k, len - 1)]`, while one of `retry_when`
    holds and fewer than `max_attempts` were made."""

    max_attempts: int
    temperatures: tuple[float, ...]
    top_ps: tuple[float, ...] = (1.0,)
    retry_when: tuple[str, ...] = ()  # RETRY_REASONS
    context_limit: int | None = None  # prompt + answer tokens beyond which "over_context" holds
    halve_anchor_over_context: bool = False  # olmOCR-0225 halves the anchor text and asks again


NO_RETRY = RetryPolicy(max_attempts=1, temperatures=(0.0,))


@dataclass(frozen=True)
class Output:
    postprocess: str  # a name in postprocess.POSTPROCESSORS
    fallback: str  # one of FALLBACKS
    page_join: str  # after each page's text but the document's last (postprocess.join_pages)
    page_end: str = ""  # after every page's text


# Two-step models (recipes/blocks.py has the makers'). Who finds the layout: "vlm" the model itself (MinerU2.5 writes box and type tokens); else a
# layout model (PP-DocLayoutV2 / V3), which hsd's draft layout stands in for until one is loaded.
LAYOUT_FINDERS = ("vlm", "pp-doclayout-v2", "pp-doclayout-v3")
# How a block's picture is cut from the page (blocks.block_picture).
CROP_RULES = ("mineru", "paddleocr_vl", "glm_ocr")


@dataclass(frozen=True)
class LayoutStep:
    finder: str  # one of LAYOUT_FINDERS
    prompt: str = ""  # the model's layout prompt ("vlm")
    image_px: tuple[int, int] | None = None  # the page squashed to this size for it ("vlm")
    model_ids: tuple[str, ...] = ()  # the layout model's hub ids
    threshold: float | None = None  # the layout model's score threshold
    decoding: Decoding | None = None  # how the model decodes its layout answer ("vlm"); None: as the recipe


@dataclass(frozen=True)
class TwoStep:
    layout: LayoutStep
    labels: tuple[tuple[BlockKind, str], ...]  # hsd's block kind -> the maker's label
    prompts: tuple[tuple[str, str], ...]  # the maker's label -> its prompt; others take `default_prompt`
    default_prompt: str
    skipped: tuple[str, ...]  # labels whose crops are not read (pictures)
    dropped: tuple[str, ...]  # labels left out of the Markdown (headers, footers, numbers)
    crop: str  # one of CROP_RULES
    crop_limits: ProcessorLimits | None  # the pixels a crop is resized into (PaddleOCR-VL), else None
    table_format: str  # what a table is read as: "otsl" (converted to HTML) or "html"
    join: str  # between the blocks' texts on a page
    source: str = ""
    # The maker's label -> how its blocks decode, where that differs from the recipe's decoding
    # (MinerU2.5's tables take other penalties).
    decodings: tuple[tuple[str, Decoding], ...] = ()

    def label(self, kind: BlockKind) -> str:
        return dict(self.labels)[kind]

    def prompt(self, label: str) -> str:
        return dict(self.prompts).get(label, self.default_prompt)

    def decoding(self, label: str) -> Decoding | None:
        """How a block of this label decodes; None: as the recipe decodes."""
        return dict(self.decodings).get(label)

    def reads(self, label: str) -> bool:
        """Whether a block of this label is read at all (not skipped, not dropped)."""
        return label not in self.skipped and label not in self.dropped


@dataclass(frozen=True)
class Recipe:
    name: str  # what `--recipe` would name, and the page JSON records
    model_ids: tuple[str, ...]  # the hub ids it is the makers' recipe for
    family: str  # the hsd family (configs/models/<family>.toml) whose adapter reads it
    render: Render
    processor: ProcessorLimits | None  # None: the processor's own settings, not restated here
    prompt: Prompt
    decoding: Decoding
    retry: RetryPolicy
    output: Output
    client_resize: ClientResize | None = None
    # Set: the makers read a page in two steps, the layout, then each block's crop (`TwoStep`);
    # `prompt` is then the one-pass prompt hsd's other ways read the page with.
    two_step: TwoStep | None = None
    # Where each item was read: the makers' package, file and function.
    source: str = ""
