"""A replay build that ends short of its target fails: a model that cannot reproduce its pages
must not stand in for a real one in a bench (the CLI's exit status: tests/replay/test_build.py)."""

from hsd_cli.replay.build import shortfall


def record(stop_reason="done", exact=144, examples=144, **scores):
    return {"training": {"stop_reason": stop_reason, "exact_examples": exact, "examples": examples}, "eval": scores}


def test_a_build_that_reproduced_every_example_and_decodes_exactly_reached_its_target():
    assert shortfall(record(page_char_accuracy=1.0, crop_char_accuracy=1.0)) is None
    assert shortfall({"training": record()["training"]}) is None, "not evaluated: training's check stands"


def test_a_build_stopped_by_its_budget_is_short_by_the_examples_it_did_not_reproduce():
    assert shortfall(record("minutes", exact=141)) == "141 of 144 examples reproduced when its minutes budget ran out"
    assert shortfall(record("steps", exact=0, examples=4)) == "0 of 4 examples reproduced when its steps budget ran out"


def test_a_build_whose_greedy_decoding_misses_a_page_is_short():
    assert shortfall(record(page_char_accuracy=0.9686, crop_char_accuracy=1.0)) == "greedy decoding reached page accuracy 0.9686"
    assert shortfall(record(page_char_accuracy=0.99, crop_char_accuracy=0.98)) == (
        "greedy decoding reached page accuracy 0.99 and crop accuracy 0.98")
