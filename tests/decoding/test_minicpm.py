"""MiniCPM-OCR and MiniCPM-V 4.6 / 4.7: MiniCPM-OCR's image processor without torchvision, the
processors' batches (every crop of every row packed in one row, image ids counted per row) and
rows prefilled together against rows prefilled apart. Decoding itself is in every exactness suite
(the families are in TINY_FAMILIES)."""

import numpy as np
import pytest
import torch
from PIL import Image

from hsd_cli.decoding.hf_target import load_target
from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.decoding.hf_target.families.minicpm import minicpm_ocr_image_processor_class
from hsd_cli.models.tiny import build_tiny_tokenizer
from hsd_cli.models.tiny_families import build_tiny_random
from hsd_cli.models.tiny_families.minicpm import MINICPM_TOKENS

from .conftest import random_image

FAMILIES = ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")

# transformers' MiniCPMOcrImageProcessor(scale_resolution=56) run with torchvision 0.28.0's own
# kernels (resize_image, normalize_image) on random_image(seed) of (height, width): its crops'
# grids, the sum and absolute sum of pixel_values, and channel by channel the first three values
# of the first patch row.
TORCHVISION_REFERENCE = {
    (80, 100, 0): (
        [[4, 4]] * 5, [2, 2], 18.596079155337065, 17105.749424613547,
        [[0.24705882370471954, 0.05882352963089943, 0.48235294222831726],
         [0.18431372940540314, 0.11372549086809158, 0.16862745583057404],
         [0.545098066329956, 0.027450980618596077, -0.32549020648002625]],
    ),
    (300, 200, 1): (
        [[4, 4]] * 9, [4, 2], 57.24706251733005, 19589.922086405568,
        [[-0.06666667014360428, 0.03529411926865578, 0.2235294133424759],
         [0.027450980618596077, 0.03529411926865578, 0.11372549086809158],
         [-0.10588235408067703, 0.05098039284348488, 0.019607843831181526]],
    ),
}


@pytest.mark.parametrize(("height", "width", "seed"), sorted(TORCHVISION_REFERENCE))
def test_the_ocr_image_processor_computes_what_torchvision_does(height, width, seed):
    sizes, grid, total, absolute, first_values = TORCHVISION_REFERENCE[(height, width, seed)]
    processor = minicpm_ocr_image_processor_class()(scale_resolution=56)
    out = processor(random_image(seed, height, width), return_tensors="pt")
    values = out["pixel_values"].double()
    assert out["target_sizes"].tolist() == sizes and out["grids"] == [grid]
    assert values.sum().item() == pytest.approx(total, rel=1e-9, abs=1e-6)
    assert values.abs().sum().item() == pytest.approx(absolute, rel=1e-9)
    assert torch.equal(out["pixel_values"][0, :, 0, :3], torch.tensor(first_values))


def test_the_ocr_image_processor_slices_as_minicpm_v_4_6s_pil_backend():
    """The same slicing rule (grids, crop sizes); the pixels differ only by PIL's bicubic rounding."""
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    for height, width in ((80, 100), (1100, 850), (40, 60)):
        picture = random_image(height, height, width)
        ours = minicpm_ocr_image_processor_class()()(picture, return_tensors="pt")
        pil = MiniCPMV4_6ImageProcessorPil(downsample_mode="4x")(picture, return_tensors="pt")
        assert ours["grids"] == pil["grids"] and torch.equal(ours["target_sizes"], pil["target_sizes"].to(torch.int32))
        # 2 levels of 255 at most, over a std of 0.5
        assert (ours["pixel_values"] - pil["pixel_values"]).abs().max().item() <= 2 / 255 / 0.5 + 1e-6


def test_the_ocr_image_processor_resizes_uint8_natively_and_skips_a_same_size_resize():
    from transformers.image_utils import PILImageResampling, SizeDict

    processor = minicpm_ocr_image_processor_class()()
    image = torch.from_numpy(np.array(random_image(3))).permute(2, 0, 1).contiguous()
    assert processor.resize(image, SizeDict(height=80, width=100), PILImageResampling.BICUBIC) is image
    assert processor.resize(image, SizeDict(height=56, width=28), PILImageResampling.BICUBIC).dtype == torch.uint8
    with pytest.raises(ValueError, match="bicubic only"):
        processor.resize(image, SizeDict(height=56, width=28), PILImageResampling.BILINEAR)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_packs_every_crop_in_one_row_and_counts_image_ids_per_row(family):
    """Why the model's `pixel_values[:1]` is every picture of a batch: the processor packs them all."""
    tokenizer = build_tiny_tokenizer(MINICPM_TOKENS)
    adapter = adapter_for(family)
    processor = adapter.new_processor(tokenizer, patch_size=14, scale_resolution=56, downsample_mode="4x")
    pictures = [random_image(1), None, random_image(2, 300, 200)]
    batch = adapter.processor_inputs(processor, pictures, ["Read.", "Text only.", "Read."])
    alone = [adapter.processor_inputs(processor, [p], ["Read."]) for p in pictures if p is not None]
    assert batch["pixel_values"].shape[0] == 1
    assert batch["pixel_values"].shape[-1] == sum(row["pixel_values"].shape[-1] for row in alone)
    texts = tokenizer.batch_decode(batch["input_ids"])
    assert [text.count("<image_id>0</image_id>") for text in texts] == [1, 0, 1]


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def minicpm_target(request, tmp_path_factory):
    model_dir = build_tiny_random(request.param, tmp_path_factory.mktemp(request.param))
    return load_target(str(model_dir), device="cpu", dtype="float32")


def test_rows_prefilled_together_equal_rows_prefilled_apart(minicpm_target):
    """Every row of a batched prefill sees its own pictures (not only the batch's first)."""
    torch.set_num_threads(1)
    pictures = [random_image(1), random_image(2, 300, 200), None]
    prompts = ["Read this.", "Read this page.", "Text only."]
    state, together = minicpm_target.prefill(minicpm_target.inputs(pictures, prompts))
    for row, (picture, prompt) in enumerate(zip(pictures, prompts)):
        alone_state, alone = minicpm_target.prefill(minicpm_target.inputs([picture], [prompt]))
        torch.testing.assert_close(together[row], alone[0], rtol=1e-4, atol=1e-4)
        assert state.rope_delta[row] == alone_state.rope_delta[0]
