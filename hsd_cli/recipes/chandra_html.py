"""Chandra's HTML answer to Markdown, as chandra-ocr does it (chandra/output.py: parse_html, the
Markdownify converter, parse_markdown), on BeautifulSoup and markdownify 1.1.0 (the version
chandra-ocr pins): the `chandra` extra. Page headers and footers are dropped, images get their
names, math becomes $..$ and $$..$$, tables stay HTML.
"""

from __future__ import annotations

import hashlib
import re

from bs4 import BeautifulSoup
from markdownify import MarkdownConverter, re_whitespace

DROPPED_LABELS = ("Page-Header", "Page-Footer")
IMAGE_LABELS = ("Image", "Figure")


def chandra_image_name(html: str, div_index: int) -> str:
    """The file name Chandra gives the crop of the page's `div_index`-th block (from 1)."""
    return f"{hashlib.md5(html.encode('utf-8')).hexdigest()}_{div_index}_img.webp"


def chandra_html(html: str, chandra_2: bool = True) -> str:
    """The answer's top-level blocks without headers and footers, images named, bare text blocks
    wrapped in <p> (chandra.output.parse_html with its defaults). Chandra 2 (chandra-ocr 0.2.0)
    also drops blank-page blocks and src-less <img> outside image blocks; chandra-ocr 0.1.8
    does neither."""
    soup = BeautifulSoup(html, "html.parser")
    out = ""
    for div_index, div in enumerate(soup.find_all("div", recursive=False), start=1):
        label = div.get("data-label")
        if chandra_2 and label == "Blank-Page":
            continue
        if label in DROPPED_LABELS:
            continue
        if label in IMAGE_LABELS:
            img = div.find("img")
            if img:
                img["src"] = chandra_image_name(html, div_index)
            else:
                div.append(BeautifulSoup(f"<img src='{chandra_image_name(html, div_index)}'/>", "html.parser"))
        elif chandra_2:
            for img in div.find_all("img"):
                if not img.get("src"):
                    img.decompose()
        if label == "Text" and not re.search("<.+>", str(div.decode_contents()).strip()):
            text = str(div.decode_contents()).strip()
            div.clear()
            div.append(BeautifulSoup(f"<p>{text}</p>", "html.parser"))
        out += str(div.decode_contents())
    return out


class ChandraMarkdown(MarkdownConverter):
    """chandra.output.Markdownify: math in dollars, tables kept as HTML, link text escaped,
    dollars escaped outside math and code."""

    def convert_math(self, el, text, parent_tags):
        if el.has_attr("display") and el["display"] == "block":
            return "\n$$" + text.strip() + "$$\n"
        return " $" + text.strip() + "$ "

    def convert_table(self, el, text, parent_tags):
        return "\n\n" + str(el) + "\n\n"

    def convert_a(self, el, text, parent_tags):
        text = re.sub(r"([\[\]()])", r"\\\1", self.escape(text))
        return super().convert_a(el, text, parent_tags)

    def escape(self, text, parent_tags=None):
        return super().escape(text, parent_tags).replace("$", r"\$")

    def process_text(self, el, parent_tags=None):
        text = str(el) or ""
        if not el.find_parent("pre"):
            text = re_whitespace.sub(" ", text)
        if not el.find_parent(["pre", "code", "kbd", "samp", "math"]):
            text = self.escape(text)
        if el.parent.name == "li" and (not el.next_sibling or el.next_sibling.name in ["ul", "ol"]):
            text = text.rstrip()
        return text


def chandra_markdown(html: str, chandra_2: bool = True) -> str:
    """chandra.output.parse_markdown with its defaults; "" where the converter fails, as there."""
    converter = ChandraMarkdown(
        heading_style="ATX", bullets="-", escape_misc=False, escape_underscores=True,
        escape_asterisks=True, sub_symbol="<sub>", sup_symbol="<sup>",
    )
    try:
        markdown = converter.convert(chandra_html(html, chandra_2))
    except Exception:  # noqa: BLE001 - Chandra prints the error and keeps an empty page
        markdown = ""
    return markdown.strip()
