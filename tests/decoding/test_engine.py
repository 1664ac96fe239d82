"""The batching engine: calls from several threads share one running batch; each call gets what it
gets decoding alone (tokens and counts), a call whose prefill raises fails alone, and a row past
its deadline leaves the batch."""

import threading
import time

import pytest

from hsd_cli.decoding.engine import BatchingEngine
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch, decode_stream
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.sizing import LoadSizer

from .test_continuous_batching import NamedScriptTarget
from .test_exactness import edit, generate_greedy

LENGTH = 40


def counts(result):
    stats = result.stats
    return result.tokens, result.stop_reason, stats.forwards, stats.new_tokens, stats.proposed, stats.accepted


def in_threads(engine, calls, rows):
    """Each call (requests, sizer factory) on its own thread, all submitted while the engine is
    held (`rows`: their requests in all), so that they wait together and must share forwards."""
    results = [None] * len(calls)

    def run(index, requests, make_sizer):
        results[index] = engine.decode_batch(requests(), sizer=make_sizer())

    threads = [threading.Thread(target=run, args=(i, *call)) for i, call in enumerate(calls)]
    with engine.exclusive():
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while engine._next_key < rows and time.monotonic() < deadline:  # every call handed in
            time.sleep(0.01)
    for thread in threads:
        thread.join()
    return results


def test_calls_from_threads_get_what_they_get_alone(tiny_target, make_image):
    cases = [(make_image(31, 56, 56), "Read."), (make_image(32, 112, 84), "Transcribe the text."),
             (make_image(33, 84, 112), "Read the page."), (make_image(34, 84, 84), "Transcribe.")]
    references = [generate_greedy(tiny_target, image, prompt, LENGTH) for image, prompt in cases]
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)

    def page_with_region(page, region):
        # A page row whose draft grows by a region row's output, as the packed stage asks.
        def requests():
            return [
                DecodeRequest(*cases[page], DraftProposer([edit(references[page], 3, substitute=0.2)])),
                DecodeRequest(*cases[region], DraftProposer([references[region]]), feeds=0),
            ]
        return requests

    def single(case, proposer):
        return lambda: [DecodeRequest(*cases[case], proposer())]

    def load_sized():
        return LoadSizer(lambda rows, width, context: max(1.0, rows * width / 8), batch_rows=4)

    calls = [
        (page_with_region(0, 1), load_sized),
        (single(2, lambda: DraftProposer([edit(references[2], 1, substitute=0.3)])), lambda: None),
        (single(3, NoDraftProposer), load_sized),
        (page_with_region(3, 2), lambda: None),
    ]
    alone = [decode_batch(tiny_target, requests(), config, separate_prefill=True, sizer=make_sizer()) for requests, make_sizer in calls]
    engine = BatchingEngine(tiny_target, config, max_rows=4)
    shared = in_threads(engine, calls, rows=6)
    engine.close()
    assert [[counts(r) for r in results] for results in shared] == [[counts(r) for r in results] for results in alone]
    assert [r.tokens for r in shared[1]] == [references[2]]
    assert any(rows > 2 for result in shared[0] for rows, _, _ in result.stats.steps), "calls shared forwards"


class FailingPrefillTarget(NamedScriptTarget):
    """Prefills one row at a time (as the engine asks); a prompt of "-1" raises there."""

    def prefill_each(self, inputs):
        if any(-1 in one["scripts"] for one in inputs):
            raise RuntimeError("this page's prefill failed")
        return self.prefill({"scripts": [script for one in inputs for script in one["scripts"]]})

    def forward_tree(self, state, tokens, depths, ancestors, valid=None):
        time.sleep(0.002)  # steps long enough for the other calls to arrive while rows decode
        return super().forward_tree(state, tokens, depths, ancestors, valid)


def test_a_call_whose_prefill_raises_fails_alone():
    scripts = [list(range(10, 60)), list(range(20, 45)) + [99]]
    target = FailingPrefillTarget(scripts)
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)
    engine = BatchingEngine(target, config, max_rows=4)
    errors = {}
    results = {}

    def run(name, prompt):
        try:
            results[name] = engine.decode_batch([DecodeRequest(None, prompt, NoDraftProposer())])
        except RuntimeError as exc:
            errors[name] = str(exc)

    threads = [threading.Thread(target=run, args=args) for args in (("first", "0"), ("bad", "-1"), ("second", "1"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.close()
    assert errors == {"bad": "this page's prefill failed"}
    assert results["first"][0].tokens == scripts[0][:LENGTH]
    assert results["second"][0].tokens == scripts[1]


def test_a_row_past_its_deadline_leaves_and_the_others_decode_on():
    scripts = [list(range(10, 60)), list(range(20, 45)) + [99]]
    target = NamedScriptTarget(scripts)
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)
    requests = [
        DecodeRequest(None, "0", NoDraftProposer(), deadline=time.monotonic() - 1),
        DecodeRequest(None, "1", NoDraftProposer()),
    ]
    results = dict(decode_stream(target, requests, config, max_rows=2))
    assert results[0].stop_reason == "deadline" and results[0].tokens == scripts[0][:1]
    assert results[1].tokens == scripts[1] and results[1].stop_reason == "eos"


def test_a_call_larger_than_the_batch_is_admitted_alone():
    scripts = [list(range(10, 30)) + [99], list(range(20, 45)) + [99], list(range(30, 40)) + [99]]
    target = FailingPrefillTarget(scripts)
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)
    engine = BatchingEngine(target, config, max_rows=2)
    results = engine.decode_batch([DecodeRequest(None, str(i), NoDraftProposer()) for i in range(3)])
    engine.close()
    assert [r.tokens for r in results] == scripts


def test_the_model_to_oneself_between_steps():
    scripts = [list(range(10, 99))]
    target = FailingPrefillTarget(scripts)
    steps = []
    forward = target.forward_tree
    target.forward_tree = lambda *args: steps.append(time.monotonic()) or forward(*args)
    engine = BatchingEngine(target, DecodeConfig(max_new_tokens=80, repetition_guard=False), max_rows=2)
    decoding = threading.Thread(target=engine.decode_batch, args=([DecodeRequest(None, "0", NoDraftProposer())],))
    decoding.start()
    while not steps:
        time.sleep(0.001)
    with engine.exclusive():
        held = len(steps)
        time.sleep(0.05)
        assert len(steps) == held, "no step while the model is held"
    decoding.join()
    engine.close()
    assert len(steps) > held


def test_a_closed_engine_refuses_calls():
    engine = BatchingEngine(NamedScriptTarget([[99]]), DecodeConfig(), max_rows=2, separate_prefill=False)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.decode_batch([DecodeRequest(None, "0", NoDraftProposer())])
