import pytest

from hsd_cli.config import ConvertConfig, UsageError, parse_page_ranges, select_pages


def test_page_ranges_parse_singles_spans_and_open_ends():
    assert parse_page_ranges("1-3,7, 10-") == [(1, 3), (7, 7), (10, None)]


@pytest.mark.parametrize("spec", ["", "0", "3-1", "a", "1,,2", "-"])
def test_bad_page_ranges_are_usage_errors(spec):
    with pytest.raises(UsageError):
        parse_page_ranges(spec)


def test_select_pages_clips_to_the_document_and_deduplicates():
    assert select_pages("2-3,3,9-", page_count=4) == [1, 2]
    assert select_pages(None, page_count=2) == [0, 1]
    assert select_pages("5", page_count=2) == []


def test_config_rejects_out_of_range_dpi(tmp_path):
    with pytest.raises(UsageError):
        ConvertConfig(output_dir=tmp_path, dpi=5)
