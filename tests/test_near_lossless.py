"""--near-lossless: the decoding core under the pipeline's math policy (stages.math_policy), the
page stage reading with it, and `hsd convert --near-lossless TAU --baseline` end to end.

The scripted target below writes a fixed text, one character a token, whatever the context, and
gives every other character 0.8 of its top token's probability: under TAU <= 0.8 every draft
token is close, so the policy alone decides where one may stand for the model's."""

import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from hsd_cli.decoding import DecodeConfig, DecodeRequest, NearLossless, decode_batch
from hsd_cli.decoding.tree import TokenTree
from hsd_cli.stages.math_policy import OutsideMath
from tests.conftest import run_hsd
from tests.decoding.test_loop import ScriptedTarget

STOP = 0  # NUL ends the output
VOCAB = 128
# Plain decoding writes SCRIPT. The draft differs from it in prose (Lat, hald, ands) and inside
# every kind of math ($...$, \(...\), $$...$$), always at the same positions.
SCRIPT = "Let $x+y=z$ hold and \\(a^2+b\\) too, so $$q=1$$ ends here."
DRAFT = "Lat $x-y=z$ hald and \\(a^3+b\\) too, so $$q=2$$ ands here."
MATH = re.compile(r"\$\$.*?\$\$|\$.*?\$|\\\(.*?\\\)")


def encode(text):
    return [ord(c) for c in text]


def decode(tokens, skip_special_tokens=True):
    return "".join(chr(t) for t in tokens if t != STOP)


class CloseCallTarget(ScriptedTarget):
    """Writes `script` by position (the token at output position t is script[t], EOS past its
    end), every other token within 0.8 of it."""

    stop_token_ids = [STOP]
    vocab = VOCAB

    def __init__(self, script):
        super().__init__(scripts=None)
        self.script = encode(script)

    def one_hot(self, row, position):
        pick = self.script[position] if position < len(self.script) else STOP
        scores = torch.full((VOCAB,), math.log(0.8))
        scores[pick] = 0.0
        return scores

    def encode(self, text):
        return encode(text)

    def decode(self, tokens, skip_special_tokens=True):
        return decode(tokens)


class AlignedDraft:
    """Proposes the rest of the draft from the output's position on (the script and the draft
    have their characters at the same positions): every step verifies every draft token left."""

    def __init__(self, draft):
        self.draft = encode(draft)

    def start(self):
        pass

    def propose(self, context):
        return TokenTree.chain(context[-1], self.draft[len(context):])

    def observe(self, accepted):
        pass


def prose_of_one_and_math_of_the_other(prose_from, math_from):
    """`prose_from`'s characters outside math, `math_from`'s inside (their math is at the same places)."""
    out = list(prose_from)
    for span in MATH.finditer(math_from):
        out[span.start():span.end()] = span.group()
    return "".join(out)


def test_the_math_policy_takes_close_tokens_in_prose_and_never_in_math():
    rule = NearLossless(0.5, OutsideMath(decode))
    target = CloseCallTarget(SCRIPT)
    config = DecodeConfig(max_new_tokens=200, repetition_guard=False)
    (plain,) = decode_batch(target, [DecodeRequest(None, "")], config)
    (relaxed,) = decode_batch(target, [DecodeRequest(None, "", AlignedDraft(DRAFT), near_lossless=rule)], config)
    assert plain.text == SCRIPT
    assert relaxed.text == prose_of_one_and_math_of_the_other(DRAFT, SCRIPT)
    assert MATH.findall(relaxed.text) == MATH.findall(plain.text)
    assert relaxed.stats.relaxed == 3  # Lat, hald, ands


def page_model(tau):
    """A VlmModel on the scripted target, built without loading anything: the page stage reads
    through its `decode` as `hsd convert`'s does (the drafts matched by token)."""
    from hsd_cli.serving.model import VlmModel

    model = object.__new__(VlmModel)
    model.near_lossless = tau
    model.target = CloseCallTarget(SCRIPT)
    model.settings = SimpleNamespace(page_prompt="", draft_match="tokens")
    model.decode_config = DecodeConfig(max_new_tokens=200)
    model.engine = model.read_sizers = None
    model.recipe = model.config = None  # read at a retry only: the page stage reads as the first attempt
    return model


@pytest.mark.parametrize("tau", [None, 0.5])
def test_the_page_stage_reads_math_as_plain_decoding_does_under_near_lossless(tau):
    from hsd_cli.models.family_settings import settings_for
    from hsd_cli.stages.page_stage import page_stage

    settings = settings_for("qwen2_5_vl")
    reading = page_stage(page_model(tau), None, [DRAFT], settings)
    assert reading.near_lossless == tau
    assert MATH.findall(reading.text) == MATH.findall(SCRIPT), "no token inside math differs from plain decoding's"
    if tau is None:
        assert reading.text == SCRIPT and reading.result.stats.relaxed == 0
    else:
        # The drafted prose stands where it is close (what the proposer proposed of it).
        assert reading.text != SCRIPT and reading.result.stats.relaxed > 0
        assert reading.text.startswith("Lat ")


def test_token_edit_distance():
    from hsd_cli.stages.page_stage import token_edit_distance

    assert token_edit_distance([1, 2, 3], [1, 2, 3]) == 0
    assert token_edit_distance([1, 2, 3], [1, 9, 3]) == 1  # one replaced
    assert token_edit_distance([1, 2, 3, 4], [1, 3, 4]) == 1  # one deleted, the rest realigned
    assert token_edit_distance([], [5, 6]) == 2
    assert token_edit_distance([1, 2, 3], [3, 2, 1]) == 2
    assert token_edit_distance(encode("kitten"), encode("sitting")) == 3


def test_near_lossless_end_to_end_flags_the_page_and_counts_changed_tokens(tiny_model, docs_dir, tmp_path):
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", tiny_model, "--stages", "page",
        "--pages", "1", "--max-new-tokens", "24", "--near-lossless", "0.5", "--baseline", "--json",
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    page = document["pages"][0]
    assert "near_lossless" in page["flags"] and document["config"]["near_lossless"] == 0.5
    stats = page["stats"]
    assert stats["near_lossless"]["tau"] == 0.5 and stats["near_lossless"]["relaxed"] >= 0
    baseline = stats["baseline"]
    assert (baseline["changed_tokens"] == 0) == baseline["identical"]
    assert stats["near_lossless"]["relaxed"] > 0 or baseline["identical"], "only a relaxed token changes the output"
    assert json.loads(result.stdout)["near_lossless"] == 0.5


def test_without_near_lossless_nothing_says_it(tiny_model, docs_dir, tmp_path):
    result = run_hsd(
        "convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", tiny_model, "--stages", "page",
        "--pages", "1", "--max-new-tokens", "8", "--baseline", "--json",
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads((tmp_path / "report.json").read_text())
    page = document["pages"][0]
    assert "near_lossless" not in page["flags"] and "near_lossless" not in document["config"]
    assert "near_lossless" not in page["stats"] and "changed_tokens" not in page["stats"]["baseline"]
    assert json.loads(result.stdout)["near_lossless"] is None


@pytest.mark.parametrize("value", ["0", "1.5", "-1", "abc"])
def test_a_bad_near_lossless_value_is_a_usage_error(value, docs_dir, tmp_path):
    result = run_hsd("convert", docs_dir / "report.pdf", "-o", tmp_path, "--model", "m", "--near-lossless", value)
    assert result.exit_code == 2
