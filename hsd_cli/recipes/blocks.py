"""Models whose makers read a page in two steps: the layout first, then every block's crop with a
prompt for its kind (MinerU2.5, PaddleOCR-VL and -1.6, GLM-OCR). Each maker's `TwoStep`
(recipe.py) is here, with the crop rules; `block_text` has each block's text and the page's
Markdown; a recipe that carries one reads a page so (`Recipe.two_step`).

Read from the makers' packages: mineru-vl-utils 0.1.22 (mineru_client.py: MinerUClientHelper,
DEFAULT_PROMPTS; post_process/__init__.py) with mineru 2.5.4 (utils/pdf_reader.py page_to_image,
backend/vlm/vlm_magic_model.py); paddlex 3.7.2 (inference/pipelines/paddleocr_vl/pipeline.py,
configs/pipelines/PaddleOCR-VL*.yaml); glmocr 0.1.5 (config.yaml, utils/image_utils.py,
postprocess/result_formatter.py).
"""

from __future__ import annotations

import math

from PIL import Image

from hsd_cli.recipes.recipe import Decoding, LayoutStep, NgramBan, ProcessorLimits, TwoStep
from hsd_cli.recipes.sizes import smart_resize
from hsd_cli.records.kinds import BlockKind

# PP-DocLayoutV2 / V3's labels for hsd's kinds (paddlex's and glmocr's id2label).
PP_DOCLAYOUT_LABELS = (
    (BlockKind.TITLE, "doc_title"), (BlockKind.SECTION_HEADER, "paragraph_title"), (BlockKind.TEXT, "text"),
    (BlockKind.LIST, "text"), (BlockKind.TABLE, "table"), (BlockKind.FORMULA, "display_formula"),
    (BlockKind.FIGURE, "image"), (BlockKind.CAPTION, "figure_title"), (BlockKind.FOOTNOTE, "footnote"),
    (BlockKind.CODE, "algorithm"), (BlockKind.PAGE_HEADER, "header"), (BlockKind.PAGE_FOOTER, "footer"),
)

# mineru_client.MinerUSamplingParams: greedy (temperature 0, top-k 1), no-repeat-n-gram 100 over the
# answer (vllm_v1_no_repeat_ngram), per step the penalties of DEFAULT_SAMPLING_PARAMS; no budget of
# its own (hsd's applies).
MINERU_NGRAM = NgramBan(n=100, window=0, allowed=())
MINERU_LAYOUT_DECODING = Decoding(max_new_tokens=4096, stop=("<|im_end|>", "<|endoftext|>"), ngram_ban=MINERU_NGRAM)
MINERU_TEXT_DECODING = Decoding(
    max_new_tokens=4096, stop=("<|im_end|>", "<|endoftext|>"), presence_penalty=1.0, frequency_penalty=0.05, ngram_ban=MINERU_NGRAM,
)

MINERU_2_5 = TwoStep(
    layout=LayoutStep(finder="vlm", prompt="\nLayout Detection:", image_px=(1036, 1036), decoding=MINERU_LAYOUT_DECODING),
    labels=(
        (BlockKind.TITLE, "title"), (BlockKind.SECTION_HEADER, "title"), (BlockKind.TEXT, "text"),
        (BlockKind.LIST, "text"), (BlockKind.TABLE, "table"), (BlockKind.FORMULA, "equation"),
        (BlockKind.FIGURE, "image"), (BlockKind.CAPTION, "image_caption"), (BlockKind.FOOTNOTE, "page_footnote"),
        (BlockKind.CODE, "code"), (BlockKind.PAGE_HEADER, "header"), (BlockKind.PAGE_FOOTER, "footer"),
    ),
    prompts=(("table", "\nTable Recognition:"), ("equation", "\nFormula Recognition:")),
    default_prompt="\nText Recognition:",
    # prepare_for_extract's skip_list; the Markdown leaves out vlm_magic_model's discarded blocks.
    skipped=("image", "list", "equation_block"),
    dropped=("header", "footer", "page_number", "aside_text", "page_footnote"),
    crop="mineru",
    crop_limits=None,
    table_format="otsl",
    join="\n\n",
    decodings=(("table", Decoding(
        max_new_tokens=4096, stop=MINERU_TEXT_DECODING.stop, presence_penalty=1.0, frequency_penalty=0.005, ngram_ban=MINERU_NGRAM,
    )),),
    source="mineru-vl-utils 0.1.22: mineru_client.py (DEFAULT_PROMPTS, DEFAULT_SAMPLING_PARAMS, MinerUClientHelper.prepare_for_layout, "
    "parse_layout_output, prepare_for_extract, resize_by_need); post_process/__init__.py; mineru 2.5.4: "
    "backend/vlm/vlm_magic_model.py (discarded blocks), vlm_middle_json_mkcontent.py",
)

PADDLEOCR_VL = TwoStep(
    layout=LayoutStep(finder="pp-doclayout-v2", model_ids=("PaddlePaddle/PP-DocLayoutV2",)),
    labels=PP_DOCLAYOUT_LABELS,
    prompts=(("table", "Table Recognition:"), ("display_formula", "Formula Recognition:"), ("inline_formula", "Formula Recognition:")),
    default_prompt="OCR:",
    skipped=("image", "header_image", "footer_image", "chart", "seal"),
    dropped=("number", "footnote", "header", "header_image", "footer", "footer_image", "aside_text"),
    crop="paddleocr_vl",
    crop_limits=ProcessorLimits(patch_px=14, merge=2, min_pixels=112_896, max_pixels=1_003_520, resample="bicubic"),
    table_format="otsl",
    join="\n\n",
    source="paddlex 3.7.2: inference/pipelines/paddleocr_vl/pipeline.py (_paddleocr_vl_collect_page_vlm_entries_core, "
    "_paddleocr_vl_assemble_parsing_results, IMAGE_LABELS, min/max pixels); configs/pipelines/PaddleOCR-VL.yaml "
    "(markdown_ignore_labels)",
)

PADDLEOCR_VL_1_6 = TwoStep(
    layout=LayoutStep(finder="pp-doclayout-v3", model_ids=("PaddlePaddle/PP-DocLayoutV3",), threshold=0.3),
    labels=PADDLEOCR_VL.labels, prompts=PADDLEOCR_VL.prompts, default_prompt=PADDLEOCR_VL.default_prompt,
    skipped=PADDLEOCR_VL.skipped, dropped=PADDLEOCR_VL.dropped, crop="paddleocr_vl", crop_limits=PADDLEOCR_VL.crop_limits,
    table_format="otsl", join="\n\n",
    source="paddlex 3.7.2: configs/pipelines/PaddleOCR-VL-1.6.yaml; the rest as PaddleOCR-VL",
)

GLM_OCR = TwoStep(
    layout=LayoutStep(finder="pp-doclayout-v3", model_ids=("PaddlePaddle/PP-DocLayoutV3",), threshold=0.3),
    labels=PP_DOCLAYOUT_LABELS,
    prompts=(("table", "Table Recognition:"), ("display_formula", "Formula Recognition:"), ("inline_formula", "Formula Recognition:")),
    default_prompt="Text Recognition:",
    skipped=("chart", "image"),
    dropped=("header", "footer", "number", "footnote", "aside_text", "reference", "footer_image", "header_image"),
    crop="glm_ocr",
    crop_limits=None,
    table_format="html",
    join="\n\n",
    source="glmocr 0.1.5: config.yaml (task_prompt_mapping, label_task_mapping, threshold); utils/image_utils.py "
    "(crop_image_region); layout/layout_detector.py (boxes on 0-1000); postprocess/result_formatter.py",
)


def mineru_resize(image: Image.Image, min_edge: int = 28, max_edge_ratio: float = 50) -> Image.Image:
    """MinerUClientHelper.resize_by_need: a crop too thin is centred on white to an edge ratio of
    at most 50, then one whose short side is under 28 px is scaled up (bicubic)."""
    if max(image.size) / min(image.size) > max_edge_ratio:
        width, height = image.size
        new_w, new_h = (width, math.ceil(width / max_edge_ratio)) if width > height else (math.ceil(height / max_edge_ratio), height)
        padded = Image.new(image.mode, (new_w, new_h), (255, 255, 255))
        padded.paste(image, (int((new_w - width) / 2), int((new_h - height) / 2)))
        image = padded
    if min(image.size) < min_edge:
        scale = min_edge / min(image.size)
        image = image.resize((math.ceil(image.width * scale), math.ceil(image.height * scale)), Image.Resampling.BICUBIC)
    return image


def grid_box(box: tuple[float, float, float, float], size: tuple[int, int], grid: int = 1000) -> tuple[int, int, int, int]:
    """A box in pixels of a picture of `size` on a 0-`grid` grid, as MinerU's layout and
    glmocr's layout detector write boxes (int(x / width * 1000): truncated)."""
    width, height = size
    x0, y0, x1, y1 = box
    return int(x0 / width * grid), int(y0 / height * grid), int(x1 / width * grid), int(y1 / height * grid)


def block_picture(two_step: TwoStep, page: Image.Image, grid: tuple[int, int, int, int], angle: int = 0) -> Image.Image | None:
    """The picture of a block read, cut from `page` (the maker's full-resolution render) by its
    box on the 0-1000 grid, by the maker's rule; None where nothing is left of it."""
    width, height = page.size
    x0, y0, x1, y1 = grid
    if two_step.crop == "mineru":
        # prepare_for_extract: the box as fractions of the page, PIL's crop of the scaled box.
        crop = page.convert("RGB").crop((x0 / 1000 * width, y0 / 1000 * height, x1 / 1000 * width, y1 / 1000 * height))
        if crop.width < 1 or crop.height < 1:
            return None
        if angle in (90, 180, 270):
            crop = crop.rotate(angle, expand=True)
        return mineru_resize(crop)
    crop = page.crop((int(x0 * width / 1000), int(y0 * height / 1000), int(x1 * width / 1000), int(y1 * height / 1000)))
    if crop.width < 1 or crop.height < 1:
        return None
    if two_step.crop_limits is not None:
        # PaddleOCR-VL resizes each crop into its pixel range (smart_resize) before the processor.
        height_px, width_px = smart_resize(crop.height, crop.width, two_step.crop_limits)
        crop = crop.resize((width_px, height_px), Image.Resampling.BICUBIC)
    return crop
