"""The makers' recipes for the models hsd knows, each read from the makers' own code (`source`).
The long prompts are package data (recipes/prompts/*.txt), written from the makers' functions
and checked against them by tests/test_recipes_parity.py where their packages are installed.
"""

from __future__ import annotations

from dataclasses import replace
from importlib.resources import files

from hsd_cli.recipes import blocks
from hsd_cli.recipes.recipe import (
    NO_RETRY,
    AnchorText,
    ClientResize,
    Decoding,
    NgramBan,
    Output,
    ProcessorLimits,
    Prompt,
    Recipe,
    Render,
    RetryPolicy,
)


def packaged_prompt(name: str) -> str:
    """A prompt kept as package data, byte for byte (the files end without a newline)."""
    return (files("hsd_cli.recipes") / "prompts" / f"{name}.txt").read_text(encoding="utf-8")


# Qwen2-VL's and Qwen2.5-VL's image processor as their checkpoints configure it
# (preprocessor_config.json: min_pixels 3136, max_pixels 12845056, patch 14, merge 2).
QWEN2_VL_PROCESSOR = ProcessorLimits(patch_px=14, merge=2, min_pixels=3136, max_pixels=12_845_056, resample="bicubic")
QWEN_STOPS = ("<|im_end|>", "<|endoftext|>")

OLMOCR_2 = Recipe(
    name="olmocr-2",
    model_ids=("allenai/olmOCR-2-7B-1025", "allenai/olmOCR-2-7B-1025-FP8", "allenai/olmOCR-7B-0725", "allenai/olmOCR-7B-0725-FP8"),
    family="qwen2_5_vl",
    # olmocr.data.renderpdf.render_pdf_to_base64png; --target_longest_image_dim 1288.
    render=Render(renderer="pdftoppm", rule="longest_side", longest_side_px=1288, encoding="png"),
    processor=QWEN2_VL_PROCESSOR,
    # olmocr.pipeline.build_page_query: one user turn, the text before the image, no system turn.
    prompt=Prompt(text=packaged_prompt("olmocr_v4_yaml"), order=("text", "image")),
    # build_page_query's MAX_TOKENS; temperature set per attempt.
    decoding=Decoding(max_new_tokens=8000, stop=QWEN_STOPS, temperature=0.1),
    # olmocr.pipeline: TEMPERATURE_BY_ATTEMPT, --max_page_retries 8; try_single_page's
    # is_valid (finish_reason "stop", total tokens <= MODEL_MAX_CONTEXT 16384, front matter
    # parsed); process_page re-reads a page the model calls rotated, turned by its correction.
    retry=RetryPolicy(
        max_attempts=8,
        temperatures=(0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0),
        retry_when=("out_of_budget", "over_context", "unparsable", "rotation_invalid"),
        context_limit=16384,
    ),
    # make_fallback_result: pdftotext's text; build_dolma_document: "\n" between pages.
    output=Output(postprocess="olmocr_yaml", fallback="text_layer", page_join="\n"),
    source="olmocr 0.4.27: olmocr/pipeline.py (build_page_query, try_single_page, process_page, "
    "make_fallback_result, build_dolma_document, TEMPERATURE_BY_ATTEMPT, --target_longest_image_dim); "
    "olmocr/data/renderpdf.py (render_pdf_to_base64png); olmocr/prompts/prompts.py "
    "(build_no_anchoring_v4_yaml_prompt); olmocr/train/front_matter.py (FrontMatterParser)",
)

OLMOCR_0225 = Recipe(
    name="olmocr-0225",
    model_ids=("allenai/olmOCR-7B-0225-preview",),
    family="qwen2_vl",
    render=Render(renderer="pdftoppm", rule="longest_side", longest_side_px=1024, encoding="png"),
    processor=QWEN2_VL_PROCESSOR,
    prompt=Prompt(
        text=packaged_prompt("olmocr_0225_anchored"), order=("text", "image"),
        anchor=AnchorText(engine="olmocr_pdfreport", max_chars=6000),
    ),
    decoding=Decoding(max_new_tokens=3000, stop=QWEN_STOPS, temperature=0.1),
    # A JSON that does not load, or a response over --model_max_context 8192 (which halves the
    # anchor text), or a rotated page, costs an attempt; nine temperatures, eight attempts.
    retry=RetryPolicy(
        max_attempts=8,
        temperatures=(0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
        retry_when=("over_context", "unparsable", "rotation_invalid"),
        context_limit=8192,
        halve_anchor_over_context=True,
    ),
    output=Output(postprocess="olmocr_json", fallback="text_layer", page_join="\n"),
    source="olmocr 0.1.60: olmocr/pipeline.py (build_page_query, process_page, build_dolma_document, "
    "--target_longest_image_dim 1024, --target_anchor_text_len 6000, --model_max_context 8192); "
    "olmocr/prompts/prompts.py (build_finetuning_prompt, PageResponse); olmocr/prompts/anchor.py "
    "(get_anchor_text, pdf_engine='pdfreport')",
)

# chandra.model.vllm.generate_vllm: temperature 0, top-p 0.1; retries at top-p 0.95 while
# detect_repeat_token fires (on the answer, or on it less its last 50 characters), MAX_VLLM_RETRIES 6.
CHANDRA_REPEATS = ("repeats",)

CHANDRA_2 = Recipe(
    name="chandra-2",
    model_ids=("datalab-to/chandra-ocr-2",),
    family="qwen3_5",
    # chandra.input.load_pdf_images: pypdfium2, forms flattened, IMAGE_DPI 192 raised so the
    # shortest side is MIN_PDF_IMAGE_DIM 1024.
    render=Render(renderer="pypdfium2", rule="dpi_min_side", dpi=192, min_side_px=1024, flatten_forms=True, encoding="png"),
    # chandra.model.util.scale_to_fit's defaults; the processor's own rule applies after it.
    client_resize=ClientResize(max_size=(3072, 2048), min_size=(1792, 28), grid_px=28, resample="lanczos"),
    processor=None,
    prompt=Prompt(text=packaged_prompt("chandra_ocr_layout"), order=("image", "text")),
    decoding=Decoding(max_new_tokens=12384, stop=QWEN_STOPS, temperature=0.0, top_p=0.1),
    # retry k (from 1) at temperature min(0.2 k, 0.8).
    retry=RetryPolicy(
        max_attempts=7, temperatures=(0.0, 0.2, 0.4, 0.6, 0.8), top_ps=(0.1, 0.95), retry_when=CHANDRA_REPEATS,
    ),
    # The last retry's answer is kept; the CLI joins pages with nothing between them.
    output=Output(postprocess="chandra_html", fallback="last_answer", page_join=""),
    source="chandra-ocr 0.2.0: chandra/settings.py (MODEL_CHECKPOINT, IMAGE_DPI, MIN_PDF_IMAGE_DIM, "
    "MAX_OUTPUT_TOKENS, MAX_VLLM_RETRIES); chandra/input.py (load_pdf_images); chandra/model/util.py "
    "(scale_to_fit, detect_repeat_token); chandra/model/vllm.py (generate_vllm); chandra/model/hf.py "
    "(process_batch_element, generate_hf: <|im_end|> added to the stops); chandra/prompts.py "
    "(OCR_LAYOUT_PROMPT); chandra/output.py (parse_markdown); chandra/scripts/cli.py (save_merged_output)",
)

CHANDRA_1 = Recipe(
    name="chandra-1",
    model_ids=("datalab-to/chandra",),
    family="qwen3_vl",
    render=Render(renderer="pypdfium2", rule="dpi_min_side", dpi=192, min_side_px=1024, flatten_forms=True, encoding="png"),
    client_resize=ClientResize(max_size=(3072, 2048), min_size=(28, 28), grid_px=None, resample="lanczos"),
    processor=None,
    prompt=Prompt(text=packaged_prompt("chandra1_ocr_layout"), order=("image", "text")),
    decoding=Decoding(max_new_tokens=8192, stop=("<|endoftext|>",), temperature=0.0, top_p=0.1),
    # Every retry at temperature 0.3, top-p 0.95; the repeat check runs on the Markdown.
    retry=RetryPolicy(max_attempts=7, temperatures=(0.0, 0.3), top_ps=(0.1, 0.95), retry_when=CHANDRA_REPEATS),
    output=Output(postprocess="chandra1_html", fallback="last_answer", page_join=""),
    source="chandra-ocr 0.1.8: chandra/settings.py (MODEL_CHECKPOINT datalab-to/chandra, "
    "MAX_OUTPUT_TOKENS 8192); chandra/model/util.py (scale_to_fit without a grid, detect_repeat_token "
    "on parse_markdown's output); chandra/model/vllm.py (retries at 0.3); chandra/prompts.py; chandra/output.py",
)

NANONETS_OCR_S = Recipe(
    name="nanonets-ocr-s",
    model_ids=("nanonets/Nanonets-OCR-s",),
    family="qwen2_5_vl",
    # The model card reads image files: no page renderer of its makers; hsd's render applies.
    render=Render(renderer="pymupdf", rule="dpi", dpi=150, max_pixels=4_194_304, encoding="pil"),
    processor=QWEN2_VL_PROCESSOR,
    prompt=Prompt(text=packaged_prompt("nanonets_ocr_s"), order=("image", "text"), system="You are a helpful assistant."),
    decoding=Decoding(max_new_tokens=4096, stop=QWEN_STOPS, temperature=0.0),
    retry=NO_RETRY,
    output=Output(postprocess="plain", fallback="draft", page_join="\n\n"),
    source="huggingface.co/nanonets/Nanonets-OCR-s model card (ocr_page_with_nanonets_s: system "
    "turn, image then prompt, max_new_tokens 4096, do_sample False)",
)

DEEPSEEK_OCR_2 = Recipe(
    name="deepseek-ocr-2",
    model_ids=("deepseek-ai/DeepSeek-OCR-2", "deepseek-community/DeepSeek-OCR-2"),
    family="deepseek_ocr2",
    # pdf_to_images_high_quality: PyMuPDF at 144 dpi, no cap; the PIL image to the processor.
    render=Render(renderer="pymupdf", rule="dpi", dpi=144, encoding="pil"),
    # DeepseekOCR2Processor (BASE_SIZE 1024 global view, IMAGE_SIZE 768 tiles, CROP_MODE): the
    # transformers processor's own tiling, not restated here.
    processor=None,
    # The prompt is a raw string, no chat template: "<image>\n" + the task.
    prompt=Prompt(text="<|grounding|>Convert the document to markdown.", order=("image", "text")),
    decoding=Decoding(
        max_new_tokens=8192, temperature=0.0, skip_special_tokens=False,
        ngram_ban=NgramBan(n=20, window=50, allowed=("<td>", "</td>")),
    ),
    # No retry: an answer that ends without EOS (its budget, or a repeat: SKIP_REPEAT) is not kept.
    retry=RetryPolicy(max_attempts=1, temperatures=(0.0,), retry_when=("out_of_budget",)),
    output=Output(postprocess="deepseek_refs", fallback="drop_page", page_join="", page_end="\n\n<--- Page Split --->\n"),
    source="github.com/deepseek-ai/DeepSeek-OCR-2: DeepSeek-OCR2-master/DeepSeek-OCR2-vllm/"
    "run_dpsk_ocr2_pdf.py (pdf_to_images_high_quality, NoRepeatNGramLogitsProcessor(ngram_size=20, "
    "window_size=50, whitelist <td> </td>), SamplingParams, max_model_len 8192, re_match, SKIP_REPEAT); "
    "config.py (PROMPT)",
)

HUNYUAN_OCR = Recipe(
    name="hunyuan-ocr",
    model_ids=("tencent/HunyuanOCR",),
    family="hunyuan_vl",
    # The makers read image files; hsd's render applies.
    render=Render(renderer="pymupdf", rule="dpi", dpi=150, max_pixels=4_194_304, encoding="pil"),
    processor=None,
    prompt=Prompt(
        text="Extract all information from the main body of the document image and represent it in markdown "
        "format, ignoring headers and footers. Tables should be expressed in HTML format, formulas in the "
        "document should be represented using LaTeX format, and the parsing should be organized according "
        "to the reading order.",
        order=("image", "text"), system="",
    ),
    decoding=Decoding(max_new_tokens=16384, temperature=0.0, top_p=0.95, top_k=1, repetition_penalty=1.0),
    retry=NO_RETRY,
    output=Output(postprocess="hunyuan_repeats", fallback="draft", page_join="\n\n"),
    source="github.com/Tencent-Hunyuan/HunyuanOCR: Hunyuan-OCR-master/Hunyuan-OCR-vllm/run_hy_ocr.py "
    "(create_chat_messages: system turn \"\", image then text; temperature 0, top_k 1, repetition_penalty "
    "1.0), README (vLLM max_tokens 16384, the document-parsing prompt), Hunyuan-OCR-master/Hunyuan-OCR-hf/"
    "run_hy_ocr.py (clean_repeated_substrings)",
)

GLM_OCR = Recipe(
    name="glm-ocr",
    model_ids=("zai-org/GLM-OCR",),
    family="glm_ocr",
    # glmocr's page loader: PyMuPDF at 200 dpi, the longest side at most 3500; JPEG to the server.
    render=Render(renderer="pymupdf", rule="dpi_max_side", dpi=200, longest_side_px=3500, encoding="jpeg"),
    processor=ProcessorLimits(patch_px=14, merge=2, min_pixels=12_544, max_pixels=71_372_800, resample="bicubic"),
    prompt=Prompt(text="Text Recognition:", order=("image", "text")),
    decoding=Decoding(max_new_tokens=8192, temperature=0.0, top_p=0.00001, top_k=1, repetition_penalty=1.1),
    retry=NO_RETRY,
    output=Output(postprocess="plain", fallback="draft", page_join="\n\n"),
    two_step=blocks.GLM_OCR,
    source="glmocr 0.1.5: glmocr/config.yaml and config.py (PageLoaderConfig: max_tokens, temperature, "
    "top_p, top_k, repetition_penalty, image_format, min/max_pixels, pdf_dpi, task_prompt_mapping); "
    "glmocr/dataloader/page_loader.py (build_request_from_image); glmocr/utils/image_utils.py "
    "(_render_page_to_pil). Its two steps: recipes/blocks.py GLM_OCR.",
)

PADDLEOCR_VL = Recipe(
    name="paddleocr-vl",
    model_ids=("PaddlePaddle/PaddleOCR-VL",),
    family="paddleocr_vl",
    # paddlex's PDF reader: pypdfium2 at zoom 2 (144 dpi).
    render=Render(renderer="pypdfium2", rule="dpi", dpi=144, encoding="pil"),
    processor=ProcessorLimits(patch_px=14, merge=2, min_pixels=112_896, max_pixels=1_003_520, resample="bicubic"),
    prompt=Prompt(text="OCR:", order=("image", "text")),
    decoding=Decoding(max_new_tokens=4096, temperature=0.0),
    retry=NO_RETRY,
    output=Output(postprocess="plain", fallback="draft", page_join="\n\n"),
    two_step=blocks.PADDLEOCR_VL,
    source="paddlex 3.7.2: paddlex/inference/pipelines/paddleocr_vl/pipeline.py (use_layout_detection=False: "
    "the page one block labelled prompt_label 'ocr'; 'OCR:'; min/max pixels 112896/1003520; "
    "max_new_tokens 4096); paddlex/inference/models/doc_vlm/predictor.py (image then text); "
    "paddlex/inference/utils/io/readers.py (PDFReaderBackend zoom 2.0)",
)

# PaddleOCR-VL-1.6: the same model reading, PP-DocLayoutV3 at threshold 0.3 finding the layout.
PADDLEOCR_VL_1_6 = replace(
    PADDLEOCR_VL, name="paddleocr-vl-1.6", model_ids=("PaddlePaddle/PaddleOCR-VL-1.6",), two_step=blocks.PADDLEOCR_VL_1_6,
    source=PADDLEOCR_VL.source + "; configs/pipelines/PaddleOCR-VL-1.6.yaml (PP-DocLayoutV3, threshold 0.3)",
)

MINERU_2_5 = Recipe(
    name="mineru-2.5",
    model_ids=("opendatalab/MinerU2.5-2509-1.2B",),
    family="qwen2_vl",
    # mineru.utils.pdf_reader.page_to_image: pypdfium2 at 200 dpi, the longest side at most 3500.
    render=Render(renderer="pypdfium2", rule="dpi_max_side", dpi=200, longest_side_px=3500, encoding="pil"),
    processor=None,
    # The system turn mineru_vl_utils sends (DEFAULT_SYSTEM_PROMPT), the image first.
    prompt=Prompt(text="\nText Recognition:", order=("image", "text"), system="You are a helpful assistant."),
    # MinerUSamplingParams for text and equations (tables and the layout step: blocks.MINERU_2_5).
    decoding=blocks.MINERU_TEXT_DECODING,
    retry=NO_RETRY,
    output=Output(postprocess="plain", fallback="draft", page_join="\n\n"),
    two_step=blocks.MINERU_2_5,
    source="mineru-vl-utils 0.1.22: mineru_client.py (MinerUSamplingParams, DEFAULT_PROMPTS, "
    "DEFAULT_SAMPLING_PARAMS), vlm_client/base_client.py (DEFAULT_SYSTEM_PROMPT); mineru 2.5.4: "
    "utils/pdf_reader.py (page_to_image). Its two steps: recipes/blocks.py MINERU_2_5.",
)

KNOWN_RECIPES: tuple[Recipe, ...] = (
    OLMOCR_2, OLMOCR_0225, CHANDRA_1, CHANDRA_2, NANONETS_OCR_S, DEEPSEEK_OCR_2, HUNYUAN_OCR, GLM_OCR, PADDLEOCR_VL,
    PADDLEOCR_VL_1_6, MINERU_2_5,
)
