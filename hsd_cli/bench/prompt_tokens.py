"""`hsd bench prompt-tokens`: the prompt a Qwen2-VL-family model reads per page, hsd's way today
(the family default: --dpi 150 capped at --max-pixels, the image first) against a maker's recipe
(olmOCR-2: the longest side 1288 px as pdftoppm renders it, the text first). Image tokens by the
processor's smart_resize, text tokens by the given Qwen2 tokenizer on the Qwen2-VL chat template;
and whether hsd's messages give the same token ids as the makers' own messages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hsd_cli.models.family_settings import settings_for
from hsd_cli.recipes.known import QWEN2_VL_PROCESSOR
from hsd_cli.recipes.messages import build_messages
from hsd_cli.recipes.registry import family_default, recipe_for
from hsd_cli.recipes.sizes import pdf_box_size, render_size, smart_resize

# Qwen2-VL's and Qwen2.5-VL's chat template (their chat_template.json, which olmOCR's checkpoints
# carry): a default system turn, each image as one <|image_pad|> that the processor repeats.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def prompt_ids(tokenizer, messages: list[dict], image_tokens: int) -> list[int]:
    """The prompt's token ids as the processor makes them: the chat text, the image's one
    placeholder repeated once per image token."""
    text = tokenizer.apply_chat_template(messages, chat_template=QWEN2_VL_CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text.replace("<|image_pad|>", "<|image_pad|>" * image_tokens), add_special_tokens=False)


def page_box(doc, page) -> tuple[float, float]:
    """The page's MediaBox as pdfinfo and pdftoppm read it, as near as PyMuPDF gives it (its
    short form of a float32: sizes.pdf_box_size), else PyMuPDF's rect where the box is inherited."""
    kind, value = doc.xref_get_key(page.xref, "MediaBox")
    return pdf_box_size(value) if kind == "array" else (page.mediabox.width, page.mediabox.height)


def makers_olmocr_messages(prompt: str) -> list[dict]:
    """olmocr.pipeline.build_page_query's messages, as it writes them (the image as a data URL)."""
    return [{"role": "user", "content": [{"type": "text", "text": prompt},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}]}]


def prompt_tokens(
    pdfs: Annotated[Path, typer.Argument(help="A directory of PDFs (searched recursively).")],
    tokenizer: Annotated[Path, typer.Option(help="A Qwen2 tokenizer directory (tokenizer.json).")],
    recipe: Annotated[str, typer.Option(help="The maker's recipe to compare with hsd's family default.")] = "olmocr-2",
) -> None:
    """Prompt tokens per page, hsd today against the maker's recipe."""
    import pymupdf  # here, not at import: the parent of `hsd convert` imports the benches' CLI

    from transformers import AutoTokenizer

    qwen2 = AutoTokenizer.from_pretrained(str(tokenizer))
    after = recipe_for(recipe)
    before = family_default(settings_for(after.family))
    limits = after.processor or QWEN2_VL_PROCESSOR
    totals = [0, 0]
    same_ids = True
    print(f"{'page':44} {'hsd px':>11} {'tokens':>6} {recipe + ' px':>11} {'tokens':>6}")
    for path in sorted(pdfs.rglob("*.pdf")):
        with pymupdf.open(path) as doc:
            for page in doc:
                rows = []
                for used, size_pt in ((before, (page.rect.width, page.rect.height)), (after, page_box(doc, page))):
                    width, height = render_size(used.render, size_pt)
                    h_bar, w_bar = smart_resize(height, width, limits)
                    image = (h_bar // limits.grid_px) * (w_bar // limits.grid_px)
                    ids = prompt_ids(qwen2, build_messages(used.prompt), image)
                    rows.append((f"{width}x{height}", len(ids)))
                if after.name == "olmocr-2":
                    same_ids &= ids == prompt_ids(qwen2, makers_olmocr_messages(after.prompt.text), image)
                totals = [totals[0] + rows[0][1], totals[1] + rows[1][1]]
                name = f"{path.relative_to(pdfs)}#{page.number + 1}"
                print(f"{name[-44:]:44} {rows[0][0]:>11} {rows[0][1]:>6} {rows[1][0]:>11} {rows[1][1]:>6}")
    print(f"{'total':44} {'':>11} {totals[0]:>6} {'':>11} {totals[1]:>6}  ratio {totals[1] / totals[0]:.3f}")
    if after.name == "olmocr-2":
        print(f"hsd's {recipe} messages give the makers' prompt token ids: {same_ids}")
