"""Continuous batching (`decode_stream`): requests join a batch that is already decoding and leave
it as they end; each row's tokens must be its plain decoding's, and every tree node's logits the
model's own, whatever rows share its forwards."""

from types import SimpleNamespace

import pytest
import torch

from hsd_cli.decoding import loop
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode_batch, decode_stream
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.sizing import LoadSizer
from hsd_cli.decoding.hf_target import HFTarget
from hsd_cli.decoding.tree import batch_trees

from .test_cache_logits import PROMPTS, path_tokens, step_tree
from .test_exactness import SAME_LOGITS, edit, full_forward_logits, generate_greedy
from .test_loop import ScriptedTarget

LENGTH = 60


class JoinCountingTarget(HFTarget):
    """Records, per join, how many tokens the running rows had in their cache: a join into a
    batch that has decoded is what continuous batching adds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.joins: list[list[int]] = []

    def join(self, states):
        self.joins.append(states[0].past_len.tolist())
        return super().join(states)


@pytest.mark.parametrize("separate_prefill", [False, True])
def test_rows_joining_a_running_batch_decode_as_generate_does(tiny_target, make_image, separate_prefill):
    cases = [
        (make_image(11, 56, 56), "Read."),
        (make_image(12, 112, 84), "Transcribe every word of this page, please."),
        (make_image(13, 84, 112), "Transcribe the text."),
        (make_image(14, 56, 112), "Read the page."),
        (make_image(15, 84, 84), "Transcribe."),
    ]
    references = [generate_greedy(tiny_target, image, prompt, LENGTH) for image, prompt in cases]
    # Mostly accepted, mostly rejected, none and another row's output: rows end at different steps.
    proposers = [
        DraftProposer([references[0]]), DraftProposer([edit(references[1], 1, substitute=0.3)]), NoDraftProposer(),
        DraftProposer([references[2]]), DraftProposer([edit(references[4], 2, substitute=0.05)]),
    ]
    requests = [DecodeRequest(image, prompt, proposer) for (image, prompt), proposer in zip(cases, proposers)]
    target = JoinCountingTarget(tiny_target.model, tiny_target.processor, tiny_target.adapter, kv_store=tiny_target.kv_store)
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)
    finished = list(decode_stream(target, requests, config, max_rows=2, separate_prefill=separate_prefill))
    assert sorted(index for index, _ in finished) == list(range(len(cases))), "every request once"
    for index, result in finished:
        assert result.tokens == references[index], f"request {index}"
    assert target.joins and all(max(lengths) > 0 for lengths in target.joins)
    assert len(target.joins) >= 2, "rows joined a batch that was decoding, more than once"



def test_trees_cut_by_the_load_decode_as_generate_does(tiny_target, make_image):
    """Verification sized by a price that saturates at 8 tokens a forward: trees are cut to
    different widths as rows join and leave, and every row still decodes as `generate` does."""
    cases = [(make_image(21, 56, 56), "Read."), (make_image(22, 112, 84), "Transcribe the text."), (make_image(23, 84, 112), "Read the page.")]
    references = [generate_greedy(tiny_target, image, prompt, LENGTH) for image, prompt in cases]
    proposers = [DraftProposer([references[0]]), DraftProposer([edit(references[1], 1, substitute=0.3)]), DraftProposer([references[2]])]
    requests = [DecodeRequest(image, prompt, proposer) for (image, prompt), proposer in zip(cases, proposers)]
    sizer = LoadSizer(lambda rows, width, context: max(1.0, rows * width / 8))
    config = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)
    finished = dict(decode_stream(tiny_target, requests, config, max_rows=2, sizers=lambda index: sizer))
    assert [finished[index].tokens for index in range(len(cases))] == references
    widths = {width for result in finished.values() for _, width, _ in result.stats.steps}
    assert len(widths) >= 2, f"trees were cut to several widths: {widths}"

def test_a_fixed_batch_is_the_special_case(tiny_target, make_image):
    requests = [
        DecodeRequest(make_image(16, 56, 56), "Read.", NoDraftProposer()),
        DecodeRequest(make_image(17, 112, 84), "Transcribe the text.", NoDraftProposer()),
    ]
    config = DecodeConfig(max_new_tokens=20, repetition_guard=False)
    target = JoinCountingTarget(tiny_target.model, tiny_target.processor, tiny_target.adapter, kv_store=tiny_target.kv_store)
    results = decode_batch(target, requests, config)
    assert [r.tokens for r in results] == [generate_greedy(tiny_target, r.image, r.prompt, 20) for r in requests]
    assert target.joins == [] and all(r.stats.steps[0][0] == 2 for r in results), "both rows in every forward"


def test_logits_of_a_row_joined_to_a_batch_that_has_decoded(tiny_target, make_image):
    images = [make_image(1, 56, 56), make_image(2, 112, 84)]
    running, _ = tiny_target.prefill(tiny_target.inputs([images[0]], [PROMPTS[0]]))
    first = step_tree(0, 0)
    batch = batch_trees([first])
    tiny_target.forward_tree(running, batch.tokens, batch.depths, batch.ancestors)
    tiny_target.commit(running, batch.width, [[0, 2, 5]])  # off the first branch: a gather
    committed = [[first.tokens[node] for node in (0, 2, 5)], []]
    joining, _ = tiny_target.prefill(tiny_target.inputs([images[1]], [PROMPTS[1]]))
    joining.rows = [1]
    state = tiny_target.join([running, joining])
    assert state.rows == [0, 1] and state.past_len[0] > 0
    trees = [step_tree(1, row) for row in range(2)]
    batch = batch_trees(trees)
    logits = tiny_target.forward_tree(state, batch.tokens, batch.depths, batch.ancestors).reshape(2, batch.width, -1)
    error = max(
        (logits[row, node] - full_forward_logits(tiny_target, images[row], committed[row] + path_tokens(tree, node), PROMPTS[row]))
        .abs().max().item()
        for row, tree in enumerate(trees) for node in range(len(tree))
    )
    assert error < SAME_LOGITS


class NamedScriptTarget(ScriptedTarget):
    """A scripted target whose prompt names the script, so that a request reads its own script in
    any company; joining batches concatenates their rows."""

    def inputs(self, images, prompts):
        return {"scripts": [int(prompt) for prompt in prompts]}

    def prefill(self, inputs):
        scripts = inputs["scripts"]
        state = SimpleNamespace(rows=list(range(len(scripts))), scripts=list(scripts), cached=[0] * len(scripts))
        return state, torch.stack([self.one_hot(script, 0) for script in scripts])

    def prefill_each(self, inputs):
        parts = [self.prefill(one) for one in inputs]
        return self.join([state for state, _ in parts]), torch.cat([logits for _, logits in parts])

    def forward_tree(self, state, tokens, depths, ancestors, valid=None):
        return super().forward_tree(SimpleNamespace(rows=state.scripts, cached=state.cached), tokens, depths, ancestors, valid)

    def keep_rows(self, state, keep):
        super().keep_rows(state, keep)
        state.scripts = [state.scripts[i] for i in keep]

    def join(self, states):
        return SimpleNamespace(**{key: [v for s in states for v in getattr(s, key)] for key in ("rows", "scripts", "cached")})


def test_rows_leave_at_their_deadlines_one_joining_later_with_its_own(monkeypatch):
    # The batch looks at its rows' deadlines between steps, the earliest of them worked out as rows
    # join or leave: on a clock that moves once a look, B leaves at its 3rd look (after 2 steps),
    # C joins in its place at the 4th and leaves at the 6th; A, without one, decodes to its end.
    clock = [0]

    def look():
        clock[0] += 1
        return clock[0]

    monkeypatch.setattr(loop, "monotonic", look)
    scripts = [list(range(10, 30)) + [99], list(range(30, 50)), list(range(50, 70))]
    deadlines = [None, 3, 6]
    requests = [DecodeRequest(None, str(i), NoDraftProposer(), deadline=deadline) for i, deadline in enumerate(deadlines)]
    results = dict(decode_stream(NamedScriptTarget(scripts), requests, DecodeConfig(max_new_tokens=40, repetition_guard=False), max_rows=2))
    assert (results[1].stop_reason, results[1].tokens) == ("deadline", scripts[1][:3])
    assert (results[2].stop_reason, results[2].tokens) == ("deadline", scripts[2][:3])
    assert (results[0].stop_reason, results[0].tokens) == ("eos", scripts[0])


def test_requests_wait_for_room_and_rows_that_end_on_their_first_token_make_room_at_once():
    # 99 is the stop token: requests 1 and 2 end at their prefill, while 3 and 4 still wait.
    scripts = [list(range(10, 60)), [99], [99], list(range(20, 40)), list(range(30, 45)) + [99]]
    target = NamedScriptTarget(scripts)
    config = DecodeConfig(max_new_tokens=40, repetition_guard=False)
    requests = [DecodeRequest(None, str(index), NoDraftProposer()) for index in range(len(scripts))]
    alone = [decode_batch(target, [request], config)[0].tokens for request in requests]
    in_flight = []
    for index, result in decode_stream(target, requests, config, max_rows=2):
        in_flight.append(index)
        assert result.tokens == alone[index]
    assert in_flight[:2] == [1, 2], "ended at their first token, before any step"
    assert sorted(in_flight) == list(range(len(scripts)))
    assert alone[1] == [99] and len(alone[0]) == 40
