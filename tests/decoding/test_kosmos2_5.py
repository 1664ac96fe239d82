"""Kosmos-2.5's processor as hsd batches rows: each row's image span where its image placeholders
are, also behind left padding; images cut into the image processor's patches; rows with and
without an image not mixed. (Its decoding is under every exactness test with the other families.)"""

import pytest

from hsd_cli.decoding.hf_target import load_target
from hsd_cli.models.tiny_families import build_tiny_random


@pytest.fixture(scope="module")
def kosmos(tmp_path_factory):
    model_dir = build_tiny_random("kosmos-2.5", tmp_path_factory.mktemp("kosmos2_5"))
    return load_target(str(model_dir), device="cpu", dtype="float32")


def test_each_row_has_its_image_span_where_its_placeholders_are_behind_left_padding(kosmos, make_image):
    inputs = kosmos.inputs([make_image(1), make_image(2, 56, 84)], ["<md>", "<md> with a longer prompt"])
    assert not inputs["attention_mask"][0].all(), "the shorter row is left-padded"
    image_start, image_end = kosmos.tokenizer.convert_tokens_to_ids(["<image>", "</image>"])
    for ids, span in zip(inputs["input_ids"].tolist(), inputs["image_embeds_position_mask"].tolist()):
        first, last = ids.index(image_start), ids.index(image_end)
        assert last - first - 1 == kosmos.processor.num_image_tokens
        assert span == [0] * first + [-1] + [1] * (last - first - 1) + [-1] + [0] * (len(ids) - last - 1)


def test_images_fill_the_image_processors_patches_not_the_processors_default(kosmos, make_image):
    inputs = kosmos.inputs([make_image(3, 400, 300)], ["<md>"])
    assert inputs["flattened_patches"].shape[1] == kosmos.processor.image_processor.max_patches < 4096


def test_a_batch_of_rows_with_and_without_an_image_is_a_one_line_error(kosmos, make_image):
    with pytest.raises(ValueError, match="all have an image, or none") as refused:
        kosmos.inputs([make_image(4), None], ["<md>", "<md>"])
    assert "\n" not in str(refused.value)
