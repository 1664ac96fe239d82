"""A tiny random PP-DocLayoutV3 for the tests, built from the real config's classes with its shapes
shrunk (seeded: the same weights every time), saved as a user's directory would hold one."""

from __future__ import annotations

import json
from pathlib import Path

# PP-DocLayoutV3's classes by index (glmocr 0.1.5 config.yaml, id2label).
PP_DOCLAYOUT_V3_LABELS = (
    "abstract", "algorithm", "aside_text", "chart", "content", "display_formula", "doc_title", "figure_title", "footer",
    "footer_image", "footnote", "formula_number", "header", "header_image", "image", "inline_formula", "number",
    "paragraph_title", "reference", "reference_content", "seal", "table", "text", "vertical_text", "vision_footnote",
)
TINY_SIDE = 128  # pixels a side the tiny model reads (the real one 800)


def build_tiny_layout(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import PPDocLayoutV3Config, PPDocLayoutV3ForObjectDetection
    from transformers.models.hgnet_v2 import HGNetV2Config

    width = 16
    backbone = HGNetV2Config(
        embedding_size=8, depths=(1, 1, 1, 1), hidden_sizes=(width,) * 4, stem_channels=(3, 8, 8),
        stage_in_channels=(8, width, width, width), stage_mid_channels=(8,) * 4, stage_out_channels=(width,) * 4,
        stage_num_blocks=(1,) * 4, stage_numb_of_layers=(1,) * 4, out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = PPDocLayoutV3Config(
        backbone_config=backbone, encoder_hidden_dim=width, encoder_in_channels=[width] * 3, encoder_ffn_dim=width,
        encoder_attention_heads=2, d_model=width, decoder_in_channels=[width] * 3, decoder_ffn_dim=width, decoder_layers=1,
        decoder_attention_heads=2, num_queries=12, num_prototypes=4, mask_feature_channels=[8, 8],
        x4_feat_dim=width,  # the backbone's first stage's channels, which the mask branch reads
        global_pointer_head_size=8, num_denoising=0,
        id2label=dict(enumerate(PP_DOCLAYOUT_V3_LABELS)), label2id={label: i for i, label in enumerate(PP_DOCLAYOUT_V3_LABELS)},
    )
    torch.manual_seed(seed)
    out = Path(out_dir)
    PPDocLayoutV3ForObjectDetection(config).eval().save_pretrained(out)
    processor = {
        "image_processor_type": "PPDocLayoutV3ImageProcessor", "size": {"height": TINY_SIDE, "width": TINY_SIDE},
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0, 0, 0], "image_std": [1, 1, 1], "resample": 3,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2), encoding="utf-8")
    return out
