"""`hsd bench acceptance`: the oracle target must make the decoding loop count exactly the forwards
the model takes, and the command must report every arm per page kind."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from hsd_cli.bench import bench_app
from hsd_cli.bench.oracle import OracleTarget, simulate
from hsd_cli.decoding.hf_target import load_target
from hsd_cli.decoding.loop import DecodeConfig, DecodeRequest, decode, decode_batch
from hsd_cli.decoding.proposer import DraftProposer, NoDraftProposer
from hsd_cli.models.tiny_families import build_tiny_random
from tests import fixtures

from .test_exactness import PROMPT, edit

STOP = 99


class NumberTokenizer:
    """Tokens written as their numbers: the tests hand the proposer token lists themselves."""

    def decode(self, tokens, skip_special_tokens=True) -> str:
        return " ".join(map(str, tokens))


def oracle_decode(answer, drafts):
    """Decode with the oracle; the result's tokens in the tokenizer's numbering."""
    target = OracleTarget(NumberTokenizer(), {"page": answer}, [STOP])
    proposer = DraftProposer([target.oracle_ids(draft) for draft in drafts]) if drafts else NoDraftProposer()
    result = decode_batch(target, [DecodeRequest(None, "page", proposer)], DecodeConfig(max_new_tokens=64))[0]
    result.tokens = target.tokenizer_ids(result.tokens)
    return result


def test_without_drafts_the_oracle_takes_one_forward_per_token():
    answer = [5, 17, 23, 8, 42, 11, STOP]
    result = oracle_decode(answer, [])
    assert result.tokens == answer and result.stop_reason == "eos"
    assert result.stats.forwards == len(answer)


def test_a_draft_of_the_whole_answer_is_accepted_in_one_step():
    answer = [5, 17, 23, 8, 42, 11, 30, 31, STOP]
    result = oracle_decode(answer, [answer[:-1]])
    assert result.tokens == answer
    assert result.stats.forwards == 2  # the prefill's token, then every draft token + the stop as bonus
    assert result.stats.accepted == len(answer) - 2


def test_a_wrong_draft_token_ends_the_accepted_path_there():
    answer = [5, 17, 23, 8, 42, 11, 30, 31, STOP]
    result = oracle_decode(answer, [[5, 17, 23, 60, 42, 11, 30, 31]])
    assert result.tokens == answer
    assert result.stats.accepted_hist.get(2) == 1, "17, 23 accepted, then 8 where the draft has 60"


@pytest.fixture(scope="module")
def qwen_target(tmp_path_factory):
    model_dir = build_tiny_random("qwen2_5_vl", tmp_path_factory.mktemp("oracle_qwen2_5_vl"))
    return load_target(str(model_dir), device="cpu", dtype="float32")


@pytest.mark.parametrize("match", ["tokens", "chars"])
def test_the_oracle_counts_exactly_the_forwards_the_model_takes(qwen_target, page_image, match):
    config = DecodeConfig(max_new_tokens=96)
    reference = decode(qwen_target, page_image, PROMPT, [], config).tokens
    drafts = [
        qwen_target.decode(edit(reference[:50], 3, substitute=0.1, insert=0.05, delete=0.05)),
        qwen_target.decode(reference[40:]),
    ]
    model = decode(qwen_target, page_image, PROMPT, drafts, config, match=match)
    assert model.tokens == reference and model.stats.accepted > 10
    oracle = OracleTarget(qwen_target.tokenizer, {"page": reference}, qwen_target.stop_token_ids)
    simulated = simulate(oracle, "page", drafts, match, config)
    assert simulated.forwards == model.stats.forwards
    assert simulated.accepted_hist == model.stats.accepted_hist
    assert simulated.proposed == model.stats.proposed


def test_bench_acceptance_reports_every_arm_by_page_kind(qwen_target, docs_dir, tmp_path):
    inputs, outputs = tmp_path / "pdfs", tmp_path / "outputs"
    inputs.mkdir(), outputs.mkdir()
    for name in ("report.pdf", "scan.pdf"):
        shutil.copy(docs_dir / name, inputs / name)
    items = "\n".join(f"- {item}" for item in fixtures.LIST_ITEMS)
    published = (
        f"# {fixtures.TITLE}\n\n## {fixtures.SECTION}\n\n{fixtures.LEFT_COLUMN}\n\n{fixtures.RIGHT_COLUMN}\n\n{items}"
    )
    for stem in ("report", "scan"):
        (outputs / f"{stem}_pg1_repeat1.md").write_text(published, encoding="utf-8")
    (outputs / "elsewhere_pg1_repeat1.md").write_text("no document for this one", encoding="utf-8")
    tokenizer_dir = tmp_path / "tokenizer"
    qwen_target.tokenizer.save_pretrained(tokenizer_dir)

    args = ["acceptance", "--outputs", outputs, "--inputs", inputs, "--tokenizer", tokenizer_dir, "--json"]
    result = CliRunner().invoke(bench_app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "elsewhere_pg1_repeat1.md: no document" in result.stderr
    tokens = len(qwen_target.encode(published)) + 1  # the end-of-turn token ends the answer
    assert set(report["arms"]) == {"page", "page-tokens", "page-chars", "spans"}
    assert [(p["page"], p["kind"]) for p in report["pages"]] == [("report.pdf:1", "born-digital"), ("scan.pdf:1", "scan")]
    for arm in report["arms"].values():
        assert arm["pages"] == 2 and arm["tokens"] == 2 * tokens
        assert {kind: figures["tokens"] for kind, figures in arm["kinds"].items()} == {"born-digital": tokens, "scan": tokens}
    page = report["arms"]["page"]
    assert page == report["arms"]["page-tokens"], "qwen2_5_vl matches drafts by tokens"
    assert page["forwards"] < page["tokens"] / 2, "the text-layer drafts are the page's own words"
    assert report["arms"]["spans"]["tau"] > page["tau"], "the output's own paragraphs are the ceiling"
    blocks = report["blocks"]
    assert sum(group["blocks"] for group in blocks.values()) == len(report["per_block"]) > 0
    assert {group.split("/")[0] for group in blocks} == {"pdf-text", "ocr"}
    text = blocks["pdf-text/text"]
    assert text["tau"] > 10, "a text-layer paragraph is the output's own: whole draft chains accepted"
    assert "throughput" not in report, "projected only with --profile"


def test_bench_acceptance_projects_corpus_throughput_on_a_profile(qwen_target, docs_dir, tmp_path):
    from .test_bench_throughput import flat_profile

    inputs, outputs = tmp_path / "pdfs", tmp_path / "outputs"
    inputs.mkdir(), outputs.mkdir()
    shutil.copy(docs_dir / "report.pdf", inputs / "report.pdf")
    published = f"# {fixtures.TITLE}\n\n## {fixtures.SECTION}\n\n{fixtures.LEFT_COLUMN}\n\n{fixtures.RIGHT_COLUMN}"
    (outputs / "report_pg1_repeat1.md").write_text(published, encoding="utf-8")
    tokenizer_dir, profile = tmp_path / "tokenizer", tmp_path / "profile.json"
    qwen_target.tokenizer.save_pretrained(tokenizer_dir)
    profile.write_text(json.dumps(flat_profile("analytic").to_json()))
    args = ["acceptance", "--outputs", outputs, "--inputs", inputs, "--tokenizer", tokenizer_dir, "--profile", profile,
            "--rows", "1,2", "--json"]
    result = CliRunner().invoke(bench_app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    throughput = json.loads(result.stdout)["throughput"]
    assert throughput["profile_kind"] == "analytic" and set(throughput["kinds"]) == {"born_digital", "all"}
    arms = throughput["kinds"]["born_digital"]["arms"]
    assert set(arms) == {"generate", "plain-cb", "hsd-1", "hsd-cb"}
    # At a flat price the page's own words as drafts read it in a fraction of generate's forwards.
    assert arms["hsd-1"]["pages_per_s"] > 2 * arms["generate"]["pages_per_s"]
    assert throughput["kinds"]["all"]["by_rows"]["1"] == throughput["kinds"]["born_digital"]["by_rows"]["1"]


def test_bench_acceptance_prices_the_prefill_at_the_recipes_picture(qwen_target, docs_dir, tmp_path):
    from dataclasses import replace

    from hsd_cli.profiles import PrefillCost

    from .test_bench_throughput import flat_profile

    inputs, outputs = tmp_path / "pdfs", tmp_path / "outputs"
    inputs.mkdir(), outputs.mkdir()
    shutil.copy(docs_dir / "report.pdf", inputs / "report.pdf")  # A4: 595 x 842 pt
    (outputs / "report_pg1_repeat1.md").write_text(f"# {fixtures.TITLE}\n\n{fixtures.LEFT_COLUMN}", encoding="utf-8")
    tokenizer_dir, profile = tmp_path / "tokenizer", tmp_path / "profile.json"
    qwen_target.tokenizer.save_pretrained(tokenizer_dir)
    # A prefill costs a microsecond per pixel of the square picture's area; forwards a flat price.
    by_area = (PrefillCost(100, 10, 100**2 * 1e-6), PrefillCost(4000, 10_000, 4000**2 * 1e-6))
    profile.write_text(json.dumps(replace(flat_profile("analytic"), prefills=by_area).to_json()))
    args = ["acceptance", "--outputs", outputs, "--inputs", inputs, "--tokenizer", tokenizer_dir, "--profile", profile,
            "--rows", "1", "--json"]

    def generate(*recipe):
        result = CliRunner().invoke(bench_app, [str(a) for a in (*args, *recipe)])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        arm = report["throughput"]["kinds"]["born_digital"]["arms"]["generate"]
        return report, arm["prefill_share"] / arm["pages_per_s"], arm["decode_pages_per_s"]

    default, default_prefill_s, default_decode = generate()
    makers, makers_prefill_s, makers_decode = generate("--recipe", "olmocr-2")
    # hsd's 150 dpi: 1240 x 1754 px, a square of side 1475; olmOCR's longest side 1288: 911 x 1288, side 1083.
    assert default_prefill_s == pytest.approx(1475**2 * 1e-6, rel=0.01)
    assert makers_prefill_s == pytest.approx(1083**2 * 1e-6, rel=0.01)
    assert makers_decode == default_decode, "the same answer in the same steps: only the prefill moves"
    assert "recipe" not in default and default["max_new_tokens"] == 4096
    assert makers["recipe"] == "olmocr-2" and makers["max_new_tokens"] == 8000
