"""The special tokens of each family's tiny tokenizer (`hsd_cli.models.tiny`): names as the
family's processor and config expect them, and a chat template in the family's form."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TinyTokens:
    """A family's special tokens as its processor and config expect them."""

    pad: str
    eos: str
    image: str
    video: str
    vision_start: str
    vision_end: str
    others: tuple[str, ...] = ()
    chat_template: str = ""
    # (tokenizer attribute, token): further special tokens a processor reads from the tokenizer.
    named: tuple[tuple[str, str], ...] = ()

    @property
    def all(self) -> list[str]:
        named = [token for _, token in self.named]
        return list(dict.fromkeys([self.pad, self.eos, self.image, self.video, self.vision_start, self.vision_end, *self.others, *named]))


QWEN_TOKENS = TinyTokens(
    pad="<|endoftext|>",
    eos="<|im_end|>",
    image="<|image_pad|>",
    video="<|video_pad|>",
    vision_start="<|vision_start|>",
    vision_end="<|vision_end|>",
    others=("<|im_start|>",),
    chat_template=(
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
)

# LightOnOCR's processor also reads an image-break token from the tokenizer (image-end: vision_end).
LIGHTON_OCR_TOKENS = replace(QWEN_TOKENS, named=(("image_break_token", "<|vision_pad|>"),))

PADDLE_TOKENS = TinyTokens(
    pad="<unk>",
    eos="</s>",
    image="<|IMAGE_PLACEHOLDER|>",
    video="<|video_pad|>",
    vision_start="<|IMAGE_START|>",
    vision_end="<|IMAGE_END|>",
    others=("<s>",),
    chat_template=(
        "{% for message in messages %}{% if message['role'] == 'user' %}User: "
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n"
        "{% else %}Assistant: {{ message['content'] }}</s>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}Assistant: {% endif %}"
    ),
)

HUNYUAN_TOKENS = TinyTokens(
    pad="<｜hy_pad｜>",
    eos="<｜hy_eos｜>",
    image="<｜hy_image｜>",
    video="<｜hy_video｜>",
    vision_start="<｜hy_image_start｜>",
    vision_end="<｜hy_image_end｜>",
    others=("<｜hy_newline｜>", "<｜hy_User｜>", "<｜hy_Assistant｜>"),
    chat_template=(
        "{% for message in messages %}{% if message['role'] == 'user' %}<｜hy_User｜>"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<｜hy_image_start｜><｜hy_image｜><｜hy_image_end｜>"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
        "{% else %}<｜hy_Assistant｜>{{ message['content'] }}<｜hy_eos｜>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<｜hy_Assistant｜>{% endif %}"
    ),
)

GLM_OCR_TOKENS = TinyTokens(
    pad="<|endoftext|>",
    eos="<|endoftext|>",
    image="<|image|>",
    video="<|video|>",
    vision_start="<|begin_of_image|>",
    vision_end="<|end_of_image|>",
    others=("<|begin_of_video|>", "<|end_of_video|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>"),
    chat_template=(
        "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
)

# GOT-OCR 2.0's processor writes these tokens itself (no chat template, as its checkpoint has none).
GOT_OCR2_TOKENS = replace(QWEN_TOKENS, image="<imgpad>", vision_start="<img>", vision_end="</img>", chat_template="")

IDEFICS3_TOKENS = TinyTokens(
    pad="<|endoftext|>",
    eos="<end_of_utterance>",
    image="<image>",
    video="<video>",
    vision_start="<fake_token_around_image>",
    vision_end="<global-img>",
    others=("<|im_start|>",),
    chat_template=(
        "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
        "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
)

# Qianfan-OCR (InternVL-style): the chat template writes `<image>`, which the processor replaces by
# <img>, <IMG_CONTEXT> repeated, </img>; it reads those three from the tokenizer by these names.
QIANFAN_OCR_TOKENS = replace(
    QWEN_TOKENS,
    image="<IMG_CONTEXT>",
    vision_start="<img>",
    vision_end="</img>",
    chat_template=(
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<image>\n"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    named=(("start_image_token", "<img>"), ("end_image_token", "</img>"), ("context_image_token", "<IMG_CONTEXT>")),
)
