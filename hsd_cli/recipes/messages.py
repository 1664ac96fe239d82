"""The chat messages a recipe's model reads, in the shape the makers build them (the shape chat
templates take: a user turn whose content is a list of {"type": "image"} and {"type": "text"}
parts, after an optional system turn). The image part is a placeholder: the processor puts the
page's pixels there."""

from __future__ import annotations

from hsd_cli.recipes.recipe import Prompt

ANCHOR_SLOT = "{anchor}"


def prompt_text(prompt: Prompt, anchor_text: str | None = None) -> str:
    """The prompt's text, with the page's anchor text put in its slot where the prompt takes one
    (olmOCR-0225: olmocr.prompts.build_finetuning_prompt). A slot, not str.format: the makers'
    prompts hold braces and brackets of their own."""
    if prompt.anchor is None:
        return prompt.text
    if anchor_text is None:
        raise ValueError("this prompt takes the page's anchor text")
    return prompt.text.replace(ANCHOR_SLOT, anchor_text)


def user_content(prompt: Prompt, anchor_text: str | None = None) -> list[dict]:
    """The user turn's parts in the makers' order; an empty prompt is the image alone."""
    text = prompt_text(prompt, anchor_text)
    parts = {"image": {"type": "image"}, "text": {"type": "text", "text": text}}
    return [parts[kind] for kind in prompt.order if kind == "image" or text]


def build_messages(prompt: Prompt, anchor_text: str | None = None) -> list[dict]:
    """The conversation as the makers send it: their system turn where they send one (None leaves
    the chat template's default), then the user turn."""
    system = [] if prompt.system is None else [{"role": "system", "content": prompt.system}]
    return system + [{"role": "user", "content": user_content(prompt, anchor_text)}]


def image_first(prompt: Prompt) -> bool:
    """Whether the image comes before the text in the user turn (hsd's adapters today always put
    it first; olmOCR puts its text first)."""
    return prompt.order.index("image") < prompt.order.index("text")
