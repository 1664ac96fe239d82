"""Loop behaviour beyond plain exactness: text drafts, near-lossless mode, guards, dtypes, the
seconds a step spends in its forward and around it."""

from types import SimpleNamespace

import pytest
import torch

from hsd_cli.decoding import loop
from hsd_cli.decoding.hf_target import load_target
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode, decode_batch, decode_many
from hsd_cli.decoding.repetition import REPETITION_SPAN, STRUCTURE_MARGIN_UNITS, structure_allowance
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.decoding.tree import WIDTH_BUCKETS
from hsd_cli.decoding.stats import DecodeStats
from hsd_cli.decoding.verify import NearLossless, SamplingConfig

from .test_exactness import full_forward_all_logits

PROMPT = "Transcribe the text."
LENGTH = 120
GREEDY = DecodeConfig(max_new_tokens=LENGTH, repetition_guard=False)


def greedy_reference(target, image):
    inputs = target.inputs([image], [PROMPT])
    out = target.model.generate(**inputs, max_new_tokens=LENGTH, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


class ScriptedTarget:
    """A fake target that writes a fixed script per row whatever the context: at a tree node of
    depth d it predicts script[cached + d + 1], `cached` being the row's output tokens in the cache."""

    stop_token_ids = [99]
    vocab = 100

    def __init__(self, scripts):
        self.scripts = scripts

    def inputs(self, images, prompts):
        return {"rows": len(prompts)}

    def one_hot(self, row, position):
        script = self.scripts[row]
        return torch.nn.functional.one_hot(torch.tensor(script[position] if position < len(script) else 98), self.vocab).float()

    def prefill(self, inputs):
        rows = list(range(inputs["rows"]))
        return SimpleNamespace(rows=rows, cached=[0] * len(rows)), torch.stack([self.one_hot(r, 0) for r in rows])

    def forward_tree(self, state, tokens, depths, ancestors, valid=None):
        logits = torch.stack([
            torch.stack([self.one_hot(row, state.cached[i] + d + 1) for d in depths[i].tolist()])
            for i, row in enumerate(state.rows)
        ])
        return logits.flatten(0, 1) if valid is None else logits[valid]

    def commit(self, state, width, kept_nodes):
        state.cached = [cached + len(nodes) for cached, nodes in zip(state.cached, kept_nodes)]

    def keep_rows(self, state, keep):
        state.rows = [state.rows[i] for i in keep]
        state.cached = [state.cached[i] for i in keep]

    def encode(self, text):
        return []

    def decode(self, tokens, skip_special_tokens=True):
        return ""


def test_a_steps_seconds_are_its_forward_and_the_host_work_around_it(monkeypatch):
    """What a cost profile prices per step beside the forward (DecodeStats.host_s) is measured
    apart from it: on a clock that only the target's forward (1 s) and cache edit (0.25 s) move."""
    clock = [0.0]
    monkeypatch.setattr(loop, "perf_counter", lambda: clock[0])

    class TimedTarget(ScriptedTarget):
        def forward_tree(self, *args):
            clock[0] += 1.0
            return super().forward_tree(*args)

        def commit(self, *args):
            clock[0] += 0.25
            super().commit(*args)

    script = list(range(10, 40))
    request = DecodeRequest(None, "", DraftProposer([script[:12] + [1, 2] + script[14:]]))
    stats = decode_batch(TimedTarget([script]), [request], DecodeConfig(max_new_tokens=25))[0].stats
    assert len(stats.steps) > 2 and stats.accepted > 10
    assert stats.forward_s == len(stats.steps) and stats.host_s == 0.25 * len(stats.steps)
    # Rows that take turns in the batch report the seconds of their own steps only.
    scripts = [script, list(range(50, 60))]
    turns = loop.decode_stream(
        TimedTarget(scripts), [DecodeRequest(None, "", NoDraftProposer()) for _ in scripts], DecodeConfig(max_new_tokens=8), max_rows=1,
    )
    for _, result in turns:
        assert result.stats.forward_s == len(result.stats.steps) == 7 and result.stats.host_s == 0.25 * 7


# Output that repeats for a while and goes on (a long dot leader: 900 tokens of one unit), output
# that loops for good (units of 3 and of 50 tokens) after some text, and text without repetition.
# Tokens 0..97 (98 ends a script, 99 is the stop token).
LONG_LEADER = list(range(10, 15)) + [7] * 900 + list(range(20, 90)) * 10
LOOP_AFTER_TEXT = list(range(10, 40)) + [1, 2, 3] * 600
LONG_UNIT_LOOP = list(range(60, 70)) + list(range(0, 50)) * 40
NO_LOOP = [(i * 7) % 97 for i in range(1900)]


def test_repetition_guard_stops_speculation_where_it_stops_plain_decoding():
    scripts = [LONG_LEADER, LOOP_AFTER_TEXT, LONG_UNIT_LOOP, NO_LOOP]
    config = DecodeConfig(max_new_tokens=1800, repetition_guard=True)
    plain = decode_batch(ScriptedTarget(scripts), [DecodeRequest(None, "", NoDraftProposer()) for _ in scripts], config)
    # A loop stops REPETITION_SPAN tokens after it starts.
    assert [(len(r.tokens), r.stop_reason) for r in plain] == [
        (1800, "budget"), (30 + REPETITION_SPAN, "repetition"), (10 + REPETITION_SPAN, "repetition"), (1800, "budget")
    ]
    # The script as its own draft: whole loops start and end inside accepted chains.
    one_by_one = [
        decode_batch(ScriptedTarget([script]), [DecodeRequest(None, "", DraftProposer([script]))], config)[0] for script in scripts
    ]
    batched = decode_batch(ScriptedTarget(scripts), [DecodeRequest(None, "", DraftProposer([s])) for s in scripts], config)
    for speculative in (one_by_one, batched):
        assert [(r.tokens, r.stop_reason) for r in speculative] == [(r.tokens, r.stop_reason) for r in plain]
        assert all(r.stats.accepted > 100 for r in speculative)
        assert [r.stats.new_tokens for r in speculative] == [len(r.tokens) for r in plain]


def test_a_repetition_the_drafts_hold_is_let_through_by_plain_and_speculative_decoding_alike():
    """A request whose drafts repeat the loop's unit 400 times (in another phase): plain and
    speculative decoding both let the run go 1,200 tokens and the margin, and stop on the next."""
    allowance = structure_allowance([[7, 7] + [2, 3, 1] * 400])
    config = DecodeConfig(max_new_tokens=1800, repetition_guard=True)

    def decoded(proposer):
        return decode_batch(ScriptedTarget([LOOP_AFTER_TEXT]), [DecodeRequest(None, "", proposer, allowance=allowance)], config)[0]

    plain, speculative = decoded(NoDraftProposer()), decoded(DraftProposer([LOOP_AFTER_TEXT]))
    assert len(plain.tokens) == 30 + 1200 + 3 * STRUCTURE_MARGIN_UNITS + 1 and plain.stop_reason == "repetition"
    assert plain.loop.start == 30 and plain.loop.unit == 3
    assert (speculative.tokens, speculative.loop) == (plain.tokens, plain.loop) and speculative.stats.accepted > 100


def test_text_drafts_with_other_markup(tiny_target, page_image):
    reference = greedy_reference(tiny_target, page_image)
    text = tiny_target.decode(reference)
    # The drafter writes the same words with other separators and emphasis.
    words = text.split()
    restyled = " ".join(f"**{w}**" if i % 5 == 0 else w for i, w in enumerate(words)).replace(".", ";")
    result = decode(tiny_target, page_image, PROMPT, [restyled], GREEDY, match="chars")
    assert result.tokens == reference
    assert result.stats.accepted > 0
    assert result.text == text


def teacher_forced_probs(target, image, tokens):
    logits = full_forward_all_logits(target, image, tokens, PROMPT)
    start = logits.shape[0] - len(tokens) - 1
    return logits[start:-1].softmax(-1)


def runner_up_draft(target, image, reference, edits=5):
    """The reference with its runner-up token where the runner-up is closest to the argmax."""
    probs = teacher_forced_probs(target, image, reference)
    top2 = probs.topk(2, dim=-1)
    ratio = top2.values[:, 1] / top2.values[:, 0]
    positions = ratio.argsort(descending=True)[:edits].tolist()
    draft = list(reference)
    for p in positions:
        draft[p] = int(top2.indices[p, 1])
    return draft, float(ratio[positions].min())


def test_near_lossless_emits_only_close_tokens_and_keeps_cache_consistent(tiny_target, page_image):
    reference = greedy_reference(tiny_target, page_image)
    draft, closest_ratio = runner_up_draft(tiny_target, page_image, reference)
    tau = 0.9 * closest_ratio
    rule = NearLossless(tau, lambda output, draft, pick: True)
    result = decode_batch(tiny_target, [DecodeRequest(page_image, PROMPT, DraftProposer([draft]), near_lossless=rule)], GREEDY)[0]
    probs = teacher_forced_probs(tiny_target, page_image, result.tokens)
    chosen = probs.gather(1, torch.tensor(result.tokens)[:, None])[:, 0]
    # Every token is the argmax or within tau of it, given the prefix actually emitted: so the
    # cache held exactly the emitted tokens.
    assert (chosen >= tau * probs.max(-1).values * (1 - 1e-4)).all()
    assert result.tokens != reference  # the relaxed rule did accept a non-argmax draft token
    assert result.stats.relaxed == sum(token != pick for token, pick in zip(result.tokens, probs.argmax(-1).tolist()))


def test_near_lossless_is_exact_where_its_policy_says_no(tiny_target, page_image):
    reference = greedy_reference(tiny_target, page_image)
    draft, closest_ratio = runner_up_draft(tiny_target, page_image, reference)
    rule = NearLossless(0.9 * closest_ratio, lambda output, draft, pick: False)
    request = DecodeRequest(page_image, PROMPT, DraftProposer([draft]), near_lossless=rule)
    result = decode_batch(tiny_target, [request], GREEDY)[0]
    assert result.tokens == reference and result.stats.relaxed == 0


def test_near_lossless_refuses_sampling():
    rule = NearLossless(0.5, lambda output, draft, pick: True)
    sampling = DecodeConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=1.0))
    with pytest.raises(ValueError, match="greedy"):
        decode_batch(ScriptedTarget([[1, 2, 3]]), [DecodeRequest(None, PROMPT, near_lossless=rule)], sampling)


class CyclingTarget:
    """A fake target whose next token is always (token + 1) % period: it loops at once."""

    stop_token_ids = [99]

    def __init__(self, period):
        self.period = period

    def inputs(self, images, prompts):
        return {"rows": len(prompts)}

    def one_hot_next(self, tokens):
        return torch.nn.functional.one_hot((tokens + 1) % self.period, 100).float()

    def prefill(self, inputs):
        state = type("State", (), {"rows": list(range(inputs["rows"]))})()
        return state, self.one_hot_next(torch.zeros(inputs["rows"], dtype=torch.long))

    def forward_tree(self, state, tokens, depths, ancestors, valid=None):
        return self.one_hot_next(tokens.flatten() if valid is None else tokens[valid])

    def commit(self, state, width, kept_nodes):
        pass

    def keep_rows(self, state, keep):
        state.rows = [state.rows[i] for i in keep]

    def encode(self, text):
        return []

    def decode(self, tokens, skip_special_tokens=True):
        return ""


def test_repetition_guard_stops_a_loop():
    config = DecodeConfig(max_new_tokens=3000, repetition_guard=True)
    looping, = decode_batch(CyclingTarget(3), [DecodeRequest(None, "")], config)
    assert looping.stop_reason == "repetition"
    assert looping.tokens == ([1, 2, 0] * REPETITION_SPAN)[:REPETITION_SPAN]
    unguarded, = decode_batch(CyclingTarget(3), [DecodeRequest(None, "")], DecodeConfig(max_new_tokens=3000, repetition_guard=False))
    assert unguarded.stop_reason == "budget" and len(unguarded.tokens) == 3000
    long_cycle, = decode_batch(CyclingTarget(80), [DecodeRequest(None, "")], config)
    assert long_cycle.stop_reason == "budget"  # a unit longer than REPETITION_MAX_UNIT tokens is not looked for


def test_bfloat16_runs(tiny_target, page_image, tmp_path):
    tiny_target.model.save_pretrained(tmp_path)
    tiny_target.processor.save_pretrained(tmp_path)
    target = load_target(str(tmp_path), device="cpu", dtype="bfloat16")
    assert target.model.dtype == torch.bfloat16
    result = decode(target, page_image, PROMPT, ["some draft text"], GREEDY)
    assert len(result.tokens) == LENGTH and result.stop_reason == "budget"


def test_decode_many_batches_in_chunks(tiny_target, make_image):
    items = [(make_image(10 + i, 56 + 14 * i, 84), f"Read block {i}.", []) for i in range(3)]
    config = DecodeConfig(max_new_tokens=30, repetition_guard=False)
    one_by_one = [decode(tiny_target, im, p, d, config).tokens for im, p, d in items]
    references = []
    for im, p, _ in items:
        inputs = tiny_target.inputs([im], [p])
        out = tiny_target.model.generate(**inputs, max_new_tokens=30, do_sample=False)
        references.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    chunked = [r.tokens for r in decode_many(tiny_target, items, config, batch_size=2)]
    assert chunked == one_by_one == references


def test_bucketed_widths_pad_the_forward_and_change_no_output(tiny_target, page_image):
    """Steps padded to their bucketed width (DecodeConfig.bucket_widths) emit the same tokens and
    counts: the padding nodes get no logits."""
    config = DecodeConfig(max_new_tokens=40, repetition_guard=False)
    plain = decode(tiny_target, page_image, PROMPT, config=config).tokens
    drafts = [tiny_target.decode([t for i, t in enumerate(plain) if i % 8 != 7]), tiny_target.decode(plain[5:])]

    def decoded(bucket_widths):
        requests = [DecodeRequest(page_image, PROMPT, loop.make_proposer(tiny_target, drafts[: n + 1])) for n in range(2)]
        requests.append(DecodeRequest(page_image, PROMPT))
        return decode_batch(tiny_target, requests, DecodeConfig(max_new_tokens=40, repetition_guard=False, bucket_widths=bucket_widths))

    exact, bucketed = decoded(False), decoded(True)
    counts = ("forwards", "new_tokens", "proposed", "accepted", "accepted_hist")
    for one, other in zip(exact, bucketed):
        assert one.tokens == other.tokens == plain
        assert [one.stats.as_dict()[c] for c in counts] == [other.stats.as_dict()[c] for c in counts]
    widths = {width for result in bucketed for _, width, _ in result.stats.steps}
    assert widths <= set(WIDTH_BUCKETS) and widths != {width for result in exact for _, width, _ in result.stats.steps}


@pytest.mark.parametrize(
    "chunk, tokens, reason",
    [
        ([1, 2, 3], [5, 1, 2, 3], None),  # nothing ends the output: the whole chunk
        ([1, 99, 3], [5, 1, 99], "eos"),  # cut after the stop token
        ([1, 2, 3, 4], [5, 1, 2, 3, 4], "budget"),  # the budget reached at the chunk's last token
        ([1, 2, 3, 4, 6], [5, 1, 2, 3, 4], "budget"),  # and past it
    ],
)
def test_a_rows_chunk_is_emitted_up_to_what_ends_its_output(chunk, tokens, reason):
    sequence = loop.DecodeSequence(DecodeRequest(None, ""), 0, tokens=[5])
    emitted = sequence.emit(chunk, {99}, DecodeConfig(max_new_tokens=5))
    assert (sequence.tokens, sequence.stop_reason, emitted) == (tokens, reason, len(tokens) - 1)


def test_a_rows_steps_counted_as_it_leaves_are_its_counts_step_by_step():
    # (rows, width, proposed, accepted, emitted, relaxed) a step; the last cut by a stop token.
    taken = [(4, 8, 7, 3, 4, 0), (4, 8, 7, 0, 1, 0), (3, 1, 0, 0, 1, 0), (3, 16, 15, 6, 2, 1)]
    stats = DecodeStats(forwards=1, new_tokens=1)
    stats.record_steps(taken)
    assert stats.steps == [(4, 8, 1), (4, 8, 5), (3, 1, 6), (3, 16, 7)], "each step's shape and the tokens before it"
    assert (stats.forwards, stats.new_tokens, stats.proposed, stats.accepted, stats.relaxed) == (5, 9, 29, 9, 1)
    assert list(stats.accepted_hist.items()) == [(3, 1), (0, 2), (6, 1)], "in the order of first occurrence"
    assert stats.as_dict()["accepted_hist"] == {"0": 2, "3": 1, "6": 1}
    stats.record_steps([])
    assert stats.forwards == 5 and len(stats.steps) == 4
