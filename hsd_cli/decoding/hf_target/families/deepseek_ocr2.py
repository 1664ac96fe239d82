"""DeepSeek-OCR-2: a SAM encoder and a Qwen2-style query encoder over a DeepSeek-V2-style
mixture-of-experts text model with plain 1-D positions.

Its text model is exact under hsd's tree forward and cache edits as any other: its attention is
ordinary multi-head attention (no latent, compressed KV), so each layer's cache holds the keys and
values of every slot as a plain DynamicLayer; its router picks each token's experts from that
token's own hidden state alone (a softmax and a top-k, no capacity limit, no dropped tokens, no
noise), so a token is routed alike in a batch, in a tree or alone.
"""

from __future__ import annotations

import json

from .base import IMAGE_FIRST, ChatLayout, FamilyAdapter, model_file

# Special tokens of the model's output markup: the grounding tags before each block
# (<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>) and the table cells its vocabulary
# holds whole. They are text, kept where special tokens are skipped.
DEEPSEEK_OUTPUT_MARKUP = ("<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<td>", "</td>")


class DeepseekOcr2Adapter(FamilyAdapter):
    """DeepSeek-OCR-2. No chat template: its conversation format is plain, the image token, a line
    break and the prompt, as its model card prompts it (the tokenizer adds the sentence start).
    Every image is a global view and, where it is larger than a tile, 2 to 6 tiles: image tokens
    per view from the processor's settings, as the model's query banks give them. DeepSeek-OCR-2's
    processor wants no torchvision; its image processor is the PIL one, whatever is installed."""

    model_types = ("deepseek_ocr2",)
    text_special_tokens = DEEPSEEK_OUTPUT_MARKUP

    def load_processor(self, path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer, DeepseekOcr2Processor
        from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config_file = model_file(path, "processor_config.json")
        settings = json.loads(config_file.read_text()) if config_file is not None else {}
        counts = {name: settings[name] for name in ("patch_size", "downsample_ratio") if name in settings}
        return DeepseekOcr2Processor(DeepseekOcr2ImageProcessorPil.from_pretrained(path), tokenizer, **counts)

    def chat_text(self, processor, prompt: str, with_image: bool, layout: ChatLayout = IMAGE_FIRST) -> str:
        return f"{processor.image_token}\n{prompt}" if with_image else prompt

    def vision_token_ids(self, config) -> list[int]:
        return [config.image_token_id]
