"""Build -> save -> load -> decode on a tiny replay model (a few steps: structure, not accuracy)."""

import itertools
import json
import pickle
from dataclasses import replace
from types import SimpleNamespace

import pymupdf
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from typer.testing import CliRunner

from hsd_cli.decoding import decode, load_target
from hsd_cli.models.tiny import QWEN_TOKENS, build_tiny_tokenizer
from hsd_cli.models.tiny_families import build_tiny_random
from hsd_cli.replay import build as replay_build
from hsd_cli.replay import replay_app, replay_pages
from hsd_cli.replay import train as replay_train
from hsd_cli.replay.build import BuildRequest, build
from hsd_cli.replay.dataset import DATA_DIR, load_examples
from hsd_cli.replay.model import TINY_SHAPE
from hsd_cli.replay.presets import default_model_dir
from hsd_cli.replay.train import annealed_rate, head_batch_order, openings_end
from hsd_cli.replay.train_config import TrainConfig, available_cpus
from hsd_cli.stages.rasterize import render_page
from tests.conftest import run_hsd

from .two_pages import build_two_page_model

# Each test builds (trains) a replay model: the slow tier.
pytestmark = pytest.mark.slow


def _request(
    replay_corpus, model_dir, steps, resume=False, evaluate=False, check_every_epoch=False, threads=1, anneal=0.3,
):
    inputs, outputs = replay_corpus
    # check_below_loss=inf: completion checks (best weights, rate halving) run after every epoch.
    train = TrainConfig(
        seed=3, max_steps=steps, warmup_steps=2, check_below_loss=float("inf") if check_every_epoch else 0.05,
        threads=threads, anneal_fraction=anneal, opening_steps=0,
    )
    return BuildRequest(
        outputs_dir=outputs, inputs_dir=inputs, model_dir=model_dir, name="fixture-replay", licence="CC0 (test)",
        shape=TINY_SHAPE, train=train, resume=resume, evaluate=evaluate,
    )


@pytest.fixture(scope="module")
def replay_model(replay_corpus, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("replay") / "fixture-replay"
    record = build(_request(replay_corpus, model_dir, steps=3, evaluate=True))
    return model_dir, record


def test_build_writes_a_loadable_model_with_record_and_card(replay_model):
    model_dir, record = replay_model
    assert record["training"]["steps"] == 3 and record["training"]["stop_reason"] == "steps"
    assert set(record["eval"]) >= {"pages", "page_char_accuracy", "crop_char_accuracy", "seconds_per_page"}
    assert record["eval"]["pages"] == 2 and record["eval"]["crops"] >= 4
    assert json.loads((model_dir / "replay.json").read_text())["parameters"] == record["parameters"]
    card = (model_dir / "README.md").read_text()
    assert "cannot read" in card and "CC0 (test)" in card and "`report.pdf` page 2" in card
    # The whole build = training + the rest (rendering, drafting, evaluation), which takes time too.
    assert record["other_seconds"] > 0
    assert record["build_seconds"] == round(record["training"]["seconds"] + record["other_seconds"], 1)
    assert f"Whole build: {record['build_seconds'] / 60:.1f} min" in card
    target = load_target(str(model_dir), device="cpu", dtype="float32")
    assert target.model_type == "qwen2_5_vl"
    page = Image.open(model_dir / "replay_data" / "images" / "p000.png").convert("RGB")
    result = decode(target, page, "Transcribe.", [], )
    assert result.stop_reason in ("eos", "budget", "repetition") and isinstance(result.text, str)


def test_a_small_build_on_a_given_tokenizer_reproduces_its_pages_and_convert_takes_the_simulated_forwards(tmp_path):
    """Two short pages that look unalike (one half black), on a tokenizer given as a directory
    (as `--tokenizer ../shared/tokenizers/qwen2` is): a build runs until greedy decoding
    reproduces both (stop reason "done"), the saved model spans the whole tokenizer, and
    `hsd convert --stages page` takes exactly the forwards `hsd bench acceptance` computes for
    arm `page` from the published pages (fp32)."""
    # The outputs write more than the text layer has, so the drafts are partly accepted.
    layers = ("Alpha beta gamma.", "Delta epsilon zeta.")
    outputs = ("# Alpha beta gamma.\n\nOne two three four.", "Delta epsilon zeta, eta.\n\nFive six.")
    record, tokenizer = build_two_page_model(tmp_path, layers, outputs, evaluate=True)
    assert record["training"]["stop_reason"] == "done" and record["training"]["exact_examples"] == 2
    assert record["eval"]["pages"] == 2 and record["eval"]["exact_pages"] == 2
    assert record["eval"]["page_char_accuracy"] == 1.0
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == record["vocab_size"] == len(tokenizer) > 1000
    assert record["trained_token_ids"] < 200  # the ids the two pages, their crops and the prompts use
    assert (tmp_path / "model" / "tokenizer.json").read_text() == (tmp_path / "tokenizer" / "tokenizer.json").read_text()

    converted = run_hsd(
        "convert", tmp_path / "in", "-o", tmp_path / "converted", "--model", tmp_path / "model", "--stages", "page",
        "--dtype", "float32", "--json",
    )
    assert converted.exit_code == 0, converted.stderr
    pages = json.loads((tmp_path / "converted" / "pages.json").read_text())["pages"]
    assert [page["markdown"].strip() for page in pages] == list(outputs)
    simulated = run_hsd(
        "bench", "acceptance", "--outputs", tmp_path / "out", "--inputs", tmp_path / "in",
        "--tokenizer", tmp_path / "tokenizer", "--json",
    )
    assert simulated.exit_code == 0, simulated.stderr
    predicted = {row["page"]: row["arms"]["page"]["forwards"] for row in json.loads(simulated.stdout)["pages"]}
    measured = {f"pages.pdf:{page['page']}": page["stats"]["page"]["forwards"] for page in pages}
    assert measured == predicted
    assert all(forwards > 2 for forwards in measured.values())  # drafts accepted in part, not whole


def test_eval_command_prints_the_scores_as_json(replay_model):
    model_dir, record = replay_model
    result = CliRunner().invoke(replay_app, ["eval", str(model_dir), "--dtype", "float32", "--json"])
    assert result.exit_code == 0, result.stderr
    scores = json.loads(result.stdout)
    assert (scores["pages"], scores["crops"]) == (record["eval"]["pages"], record["eval"]["crops"])
    assert scores["seconds_per_page"] > 0


def test_fingerprint_check_knows_its_pages_at_any_dpi(replay_model, replay_corpus, tmp_path):
    model_dir, _ = replay_model
    inputs, _ = replay_corpus
    known = replay_pages(model_dir)
    with pymupdf.open(inputs / "report.pdf") as doc:
        for page in doc:
            assert known(render_page(page, 150, 4_194_304).picture)
            assert known(render_page(page, 90, 4_194_304).picture)
        other = pymupdf.open()
        other_page = other.new_page(width=595, height=842)
        other_page.insert_text((60, 100), "A page this model was never shown. " * 3, fontsize=14)
        assert not known(render_page(other_page, 150, 4_194_304).picture)
    assert replay_pages(build_tiny_random("qwen2_5_vl", tmp_path / "not-a-replay-model")) is None, "real models read any page"
    assert pickle.loads(pickle.dumps(known)) == known and hash(known), "it travels to workers and keys the model cache"


def test_hsd_convert_runs_the_replay_model(replay_model, replay_corpus, tmp_path):
    model_dir, _ = replay_model
    inputs, _ = replay_corpus
    result = run_hsd(
        "convert", inputs / "report.pdf", "-o", tmp_path, "--model", model_dir, "--stages", "region-page",
        "--pages", "1", "--max-new-tokens", "8", "--json",
    )
    assert result.exit_code == 0, result.stderr
    page = json.loads((tmp_path / "report.json").read_text())["pages"][0]
    assert "vlm" in page["flags"] and page["stats"]["regions"]["count"] >= 1


def test_same_seed_gives_same_weights_and_resume_continues_exactly(replay_corpus, tmp_path):
    # No annealing: it follows the step budget, which the resumed build raises from 3 to 7.
    build(_request(replay_corpus, tmp_path / "straight", steps=7, check_every_epoch=True, anneal=0.0))
    build(_request(replay_corpus, tmp_path / "resumed", steps=3, check_every_epoch=True, anneal=0.0))
    assert (tmp_path / "resumed" / "replay_checkpoint" / "train_state.pt").is_file()
    record = build(_request(replay_corpus, tmp_path / "resumed", steps=7, resume=True, check_every_epoch=True, anneal=0.0))
    assert record["training"]["steps"] == 7 and record["training"]["epochs"] >= 2
    assert 0 < record["training"]["run_seconds"] < record["training"]["seconds"]
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(bool((straight[k] == resumed[k]).all()) for k in straight)


def test_an_openings_phase_trains_first_tokens_only_and_resumes_into_full_examples(replay_corpus, tmp_path):
    def request(model_dir, steps, resume=False):
        plain = _request(replay_corpus, model_dir, steps=steps, resume=resume, anneal=0.0)
        return replace(plain, train=replace(plain.train, opening_steps=3))

    messages = []
    record = build(request(tmp_path / "resumed", steps=3), log=messages.append)
    assert record["training"]["epochs"] == 0  # no full example trained yet
    assert any(m.startswith("openings: step 3 of 3, loss ") for m in messages)
    status = CliRunner().invoke(replay_app, ["status", str(tmp_path / "resumed"), "--json"])
    assert json.loads(status.stdout)["opening_steps_left"] == 0
    resumed = build(request(tmp_path / "resumed", steps=9, resume=True))
    straight = build(request(tmp_path / "straight", steps=9))
    assert resumed["training"]["epochs"] == straight["training"]["epochs"] >= 1
    weights = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(bool((weights[0][k] == weights[1][k]).all()) for k in weights[0])


def test_openings_end_at_their_share_of_the_minutes_unless_steps_limit_the_build():
    minutes = TrainConfig(opening_steps=3000, opening_share=0.5, max_minutes=10)
    assert openings_end(minutes, end=3000, step=100, seconds=299) == 3000
    assert openings_end(minutes, end=3000, step=100, seconds=300) == 100
    assert openings_end(minutes, end=100, step=250, seconds=400) == 100  # ended already
    steps = replace(minutes, max_steps=5000)  # deterministic: time never changes what it trains
    assert openings_end(steps, end=3000, step=100, seconds=600) == 3000


def test_a_short_minute_budget_cuts_the_openings_and_trains_whole_examples(replay_corpus, tmp_path, monkeypatch):
    # A clock that moves a second each time the training loop reads it: the 1-minute budget runs
    # out within a few dozen steps, the openings (1000 steps) end at its half.
    clock = itertools.count()
    monkeypatch.setattr(replay_train, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    plain = _request(replay_corpus, tmp_path / "model", steps=None, anneal=0.0)
    request = replace(plain, train=replace(plain.train, opening_steps=1000, max_minutes=1.0))
    messages = []
    record = build(request, log=messages.append)
    ended = [m for m in messages if m.startswith("openings: ended at step ")]
    assert len(ended) == 1 and "50% of the 1 minutes" in ended[0]
    assert record["training"]["stop_reason"] == "minutes" and record["training"]["epochs"] >= 1
    status = CliRunner().invoke(replay_app, ["status", str(tmp_path / "model"), "--json"])
    assert json.loads(status.stdout)["opening_steps_left"] == 0


def test_resume_with_other_settings_names_them(replay_corpus, tmp_path):
    build(_request(replay_corpus, tmp_path / "model", steps=2))
    other = _request(replay_corpus, tmp_path / "model", steps=4, resume=True)
    other = replace(other, train=replace(other.train, learning_rate=1e-3, seed=4))
    with pytest.raises(ValueError, match=r"made with seed 3 \(this run: 4\), learning_rate 0.0005 \(this run: 0.001\)"):
        build(other)


def test_head_batches_come_in_a_new_seeded_order_every_pass():
    orders = [head_batch_order(seed=0, pass_number=n, count=17) for n in range(4)]
    assert all(sorted(order) == list(range(17)) for order in orders)
    assert len({tuple(order) for order in orders}) == 4
    assert head_batch_order(seed=0, pass_number=2, count=17) == orders[2]
    assert head_batch_order(seed=1, pass_number=2, count=17) != orders[2]


def test_the_rate_anneals_linearly_over_the_last_part_of_the_budget():
    assert annealed_rate(2e-3, 2e-5, budget_spent=0.5, anneal_fraction=0.25) == 2e-3
    assert annealed_rate(2e-3, 2e-5, budget_spent=0.75, anneal_fraction=0.25) == 2e-3
    assert annealed_rate(2e-3, 2e-5, budget_spent=0.875, anneal_fraction=0.25) == pytest.approx(1.01e-3)
    assert annealed_rate(2e-3, 2e-5, budget_spent=1.0, anneal_fraction=0.25) == pytest.approx(2e-5)
    assert annealed_rate(2e-3, 2e-5, budget_spent=1.2, anneal_fraction=0.25) == pytest.approx(2e-5)
    assert annealed_rate(1e-5, 2e-5, budget_spent=0.9, anneal_fraction=0.25) == 1e-5  # already below the floor
    assert annealed_rate(2e-3, 2e-5, budget_spent=1.0, anneal_fraction=0.0) == 2e-3  # switched off


def test_resume_may_change_the_thread_count(replay_corpus, tmp_path):
    before = torch.get_num_threads()
    try:
        build(_request(replay_corpus, tmp_path / "model", steps=2))
        record = build(_request(replay_corpus, tmp_path / "model", steps=4, resume=True, threads=2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert record["training"]["steps"] == 4 and record["train_config"]["threads"] == 2


def test_build_refuses_bad_input_with_exit_code_2(replay_corpus, tmp_path):
    inputs, outputs = replay_corpus
    runner = CliRunner()
    missing = runner.invoke(replay_app, ["build", "--outputs", str(tmp_path / "nope"), "--inputs", str(inputs)])
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1 and "--outputs" in missing.stderr
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    taken = runner.invoke(
        replay_app, ["build", "--outputs", str(outputs), "--inputs", str(inputs), "-o", str(tmp_path / "taken")]
    )
    assert taken.exit_code == 2 and "--resume" in taken.stderr and taken.stdout == ""
    threads = runner.invoke(
        replay_app, ["build", "--outputs", str(outputs), "--inputs", str(inputs), "--threads", "0", "-o", str(tmp_path / "t")]
    )
    assert threads.exit_code == 2 and "--threads" in threads.stderr and not (tmp_path / "t").exists()
    too_many = runner.invoke(
        replay_app,
        ["build", "--outputs", str(outputs), "--inputs", str(inputs), "--threads", str(available_cpus() + 1), "-o", str(tmp_path / "t")],
    )
    assert too_many.exit_code == 2 and f"the {available_cpus()} CPUs" in too_many.stderr and not (tmp_path / "t").exists()
    tokens = runner.invoke(
        replay_app, ["build", "--outputs", str(outputs), "--inputs", str(inputs), "--max-image-tokens", "8", "-o", str(tmp_path / "t")]
    )
    assert tokens.exit_code == 2 and "--max-image-tokens" in tokens.stderr and not (tmp_path / "t").exists()
    # The default openings phase (3000 steps) would leave a 100-step budget no whole examples.
    openings = runner.invoke(
        replay_app, ["build", "--outputs", str(outputs), "--inputs", str(inputs), "--steps", "100", "-o", str(tmp_path / "t")]
    )
    assert openings.exit_code == 2 and "--opening-steps 3000" in openings.stderr and not (tmp_path / "t").exists()
    assert openings.stderr.count("\n") == 1
    unknown = runner.invoke(replay_app, ["eval", str(tmp_path / "taken"), "--json"])
    assert unknown.exit_code == 2 and unknown.stdout == ""


def record_exists(model_dir):
    return (model_dir / "replay.json").is_file() and (model_dir / "config.json").is_file()


def test_max_image_tokens_sets_how_small_the_processor_makes_pages(replay_corpus, tmp_path):
    inputs, outputs = replay_corpus
    args = ["build", "--outputs", str(outputs), "--inputs", str(inputs), "--shape", "tiny", "--steps", "1", "--opening-steps", "0"]
    sizes = {}
    for tokens in (16, 64):
        model_dir = tmp_path / str(tokens)
        built = CliRunner().invoke(replay_app, [*args, "--max-image-tokens", str(tokens), "-o", str(model_dir)])
        # One step reproduces nothing: the build fails (its model is kept to resume), in one line
        # that says how to go on.
        assert built.exit_code == 1, built.stderr
        error = [line for line in built.stderr.splitlines() if line.startswith("error:")]
        assert error == [f"error: replay model {outputs.name}-replay ended short of its target: 0 of 11 examples reproduced "
                         "when its steps budget ran out; give --resume and a larger --steps to train on"]
        assert "Traceback" not in built.stderr and record_exists(model_dir)
        record = json.loads((model_dir / "replay.json").read_text())
        assert record["shape"]["max_image_tokens"] == tokens
        assert record["train_config"]["threads"] == available_cpus()  # no --threads: all it may use
        assert record["train_config"]["max_minutes"] is None, "--steps alone budgets the build"
        config = json.loads((model_dir / "processor_config.json").read_text())
        sizes[tokens] = config["image_processor"]["size"]["longest_edge"]  # pixels at most
    assert sizes[64] == 4 * sizes[16]


def test_default_model_dir_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_model_dir("olmocr-replay") == tmp_path / "hsd" / "replay" / "olmocr-replay"


def test_eval_converted_scores_a_convert_run_against_the_published_pages(replay_model, replay_corpus, tmp_path):
    from hsd_cli.replay.align import char_accuracy
    from tests.replay.conftest import PAGE_OUTPUTS

    model_dir, _ = replay_model
    inputs, _ = replay_corpus
    out = tmp_path / "out"
    converted = run_hsd("convert", inputs, "-o", out, "--model", model_dir, "--stages", "page", "--max-new-tokens", "12")
    assert converted.exit_code == 0, converted.stderr
    document = json.loads((out / "report.json").read_text())
    # Page 1 as the real system published it; page 2 whatever the barely trained model said.
    document["pages"][0]["markdown"] = PAGE_OUTPUTS[0]
    (out / "report.json").write_text(json.dumps(document))
    result = CliRunner().invoke(replay_app, ["eval", str(model_dir), "--converted", str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    scores = json.loads(result.stdout)
    assert (scores["pages"], scores["missing"]) == (2, [])
    assert scores["model_pages"] == sum(page["text_source"] == "model" for page in document["pages"])
    second = char_accuracy(document["pages"][1]["markdown"].strip(), PAGE_OUTPUTS[1].strip())
    assert scores["exact_pages"] == 1 + (second == 1.0)
    assert scores["page_char_accuracy"] == pytest.approx((1.0 + second) / 2, abs=1e-4)
    # Page 1 written by the model, page 2 its draft (a fallback): only page 1 is the model's.
    document["pages"][0]["text_source"] = "model"
    document["pages"][1].update(text_source="draft", markdown="a draft")
    (out / "report.json").write_text(json.dumps(document))
    rescored = CliRunner().invoke(replay_app, ["eval", str(model_dir), "--converted", str(out), "--json"])
    fallback = json.loads(rescored.stdout)
    assert (fallback["model_pages"], fallback["exact_pages"], fallback["model_exact_pages"]) == (1, 1, 1)
    assert fallback["model_page_char_accuracy"] == 1.0 and fallback["page_char_accuracy"] < 1.0
    empty = CliRunner().invoke(replay_app, ["eval", str(model_dir), "--converted", str(tmp_path / "nothing-here")])
    assert empty.exit_code == 2 and "not a directory" in empty.stderr


def test_status_reports_a_build_from_its_checkpoint(replay_model, tmp_path):
    model_dir, record = replay_model
    result = CliRunner().invoke(replay_app, ["status", str(model_dir), "--json"])
    assert result.exit_code == 0, result.stderr
    status = json.loads(result.stdout)
    training = record["training"]
    assert (status["steps"], status["epochs"]) == (training["steps"], training["epochs"])
    assert status["learning_rate"] == pytest.approx(TrainConfig().min_learning_rate)  # the step budget is spent
    forced = status["teacher_forced"]
    assert (forced["page"]["examples"], forced["crop"]["examples"]) == (record["eval"]["pages"], record["eval"]["crops"])
    # The checkpoint holds the weights the build's last completion check ran on.
    assert forced["page"]["reproduced"] + forced["crop"]["reproduced"] == training["exact_examples"]
    assert all(0.0 <= forced[kind]["token_accuracy"] <= 1.0 for kind in forced)
    assert all(f["reproduced"] <= f["first_token_right"] <= f["examples"] for f in forced.values())
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "replay.json").write_text(json.dumps({"name": "unfinished"}))
    early = CliRunner().invoke(replay_app, ["status", str(unfinished)])
    assert early.exit_code == 2 and "no checkpoint yet" in early.stderr and early.stderr.count("\n") == 1
    not_done = CliRunner().invoke(replay_app, ["eval", str(unfinished)])
    assert not_done.exit_code == 2 and "replay-model status" in not_done.stderr


def test_status_counts_examples_that_start_right_apart_from_reproduced_ones(replay_model, monkeypatch):
    """Margins by hand: even examples get their first token right, every third one a later token wrong."""
    def margins(model, examples, batches, pad_id, bf16):
        return [torch.tensor([1.0 if i % 2 == 0 else -1.0, -1.0 if i % 3 == 0 else 1.0]) for i in range(len(examples))]

    monkeypatch.setattr(replay_build, "answer_margins", margins)
    model_dir, _ = replay_model
    kinds = [e.kind for e in load_examples(model_dir / DATA_DIR)]
    result = CliRunner().invoke(replay_app, ["status", str(model_dir), "--json"])
    forced = json.loads(result.stdout)["teacher_forced"]
    for kind in ("page", "crop"):
        mine = [i for i, k in enumerate(kinds) if k == kind]
        assert forced[kind]["first_token_right"] == sum(i % 2 == 0 for i in mine)
        assert forced[kind]["reproduced"] == sum(i % 2 == 0 and i % 3 != 0 for i in mine)
        assert forced[kind]["token_accuracy"] == round(sum((i % 2 == 0) + (i % 3 != 0) for i in mine) / (2 * len(mine)), 4)
    text = CliRunner().invoke(replay_app, ["status", str(model_dir)])
    assert f"{forced['page']['first_token_right']} with the right first token" in text.stderr


def test_matmul_patch_projection_equals_the_stock_convolution():
    import torch

    from hsd_cli.models.tiny import QWEN_TOKENS, build_tiny_tokenizer
    from hsd_cli.replay.model import new_model, use_matmul_patch_projection

    tokenizer = build_tiny_tokenizer(QWEN_TOKENS, TINY_SHAPE.vocab_size)
    model = new_model(TINY_SHAPE, tokenizer, seed=0)
    stock = model.model.visual.patch_embed
    patches = torch.randn(6, stock.in_channels * stock.temporal_patch_size * stock.patch_size**2)
    keys = set(model.state_dict())
    expected = stock(patches)
    expected.pow(2).sum().backward()
    expected_grad, stock.proj.weight.grad = stock.proj.weight.grad.clone(), None
    use_matmul_patch_projection(model)
    projected = model.model.visual.patch_embed(patches)
    projected.pow(2).sum().backward()
    assert type(model.model.visual.patch_embed.proj) is not torch.nn.Conv3d
    torch.testing.assert_close(projected, expected)
    # Same sums in another order: fp32 rounding only.
    torch.testing.assert_close(model.model.visual.patch_embed.proj.weight.grad, expected_grad, rtol=1e-4, atol=1e-4)
    assert set(model.state_dict()) == keys  # saved weights load into the stock module


def test_the_saved_model_gives_unused_ids_the_logit_of_the_row_that_stands_for_them():
    """Training runs over the used ids only; the saved model over every id must pick what the
    trained one picks: the used ids keep their logits, every other id gets row 0's."""
    import torch

    from hsd_cli.replay.model import TrainedVocabulary, full_vocabulary_model, new_model

    tokenizer = build_tiny_tokenizer(QWEN_TOKENS, 800)
    used = [tokenizer.encode("Alpha beta gamma.", add_special_tokens=False), [17, 404, 799]]
    vocabulary = TrainedVocabulary.of(tokenizer, used)
    trained = new_model(TINY_SHAPE, tokenizer, seed=0, vocabulary=vocabulary)
    assert trained.config.text_config.vocab_size == vocabulary.size < 40
    full = full_vocabulary_model(trained, TINY_SHAPE, tokenizer, vocabulary)
    assert full.config.text_config.vocab_size == len(tokenizer)
    assert full.config.image_token_id == tokenizer.convert_tokens_to_ids(QWEN_TOKENS.image)
    text = torch.tensor([[17, 404, 799, *used[0]]])
    rows = vocabulary.rows(len(tokenizer))
    with torch.no_grad():
        dense_logits = trained(input_ids=rows[text]).logits[0]
        full_logits = full(input_ids=text).logits[0]
    ids = torch.tensor(vocabulary.ids)
    torch.testing.assert_close(full_logits[:, ids], dense_logits[:, 1:])
    unused = rows == 0
    assert int(unused.sum()) == len(tokenizer) - len(vocabulary.ids)
    torch.testing.assert_close(full_logits[:, unused], dense_logits[:, :1].expand(-1, int(unused.sum())))


def test_a_build_on_a_makers_recipe_learns_that_models_input_and_convert_reads_it_so(replay_corpus, tmp_path):
    """A replay model that stands for olmOCR-2 is trained on olmOCR-2's input (its render of each
    page, its prompt before the image) and answers as olmOCR-2 does (front matter, then
    the published text); `hsd convert --model` then reads it with that recipe unless --recipe
    names another."""
    from hsd_cli.recipes.registry import recipes
    from hsd_cli.recipes.sizes import render_size

    olmocr = recipes()["olmocr-2"]
    model_dir = tmp_path / "olmocr-like"
    build(replace(_request(replay_corpus, model_dir, steps=2), recipe="olmocr-2"))
    assert json.loads((model_dir / "replay.json").read_text())["recipe"] == "olmocr-2"
    inputs, _ = replay_corpus
    with pymupdf.open(inputs / "report.pdf") as doc:
        size_pt = (doc[0].rect.width, doc[0].rect.height)
    with Image.open(model_dir / "replay_data" / "images" / "p000.png") as page:
        assert page.size == render_size(olmocr.render, size_pt)
    examples = json.loads((model_dir / "replay_data" / "examples.json").read_text())
    pages = [e for e in examples if e["kind"] == "page"]
    assert all(e["target"].startswith("---\nprimary_language: en\n") for e in pages)
    assert all(not e["target"].startswith("---") for e in examples if e["kind"] == "crop")

    for options, recipe in (((), "olmocr-2"), (("--recipe", "hsd-qwen2_5_vl"), "hsd-qwen2_5_vl")):
        out = tmp_path / recipe
        result = run_hsd("convert", inputs / "report.pdf", "-o", out, "--model", model_dir, "--stages", "page",
                         "--pages", "1", "--max-new-tokens", "4", "--greedy", *options)
        assert result.exit_code == 0, result.stderr
        read = json.loads((out / "report.json").read_text())["pages"][0]["stats"]["model_input"]
        assert read["recipe"] == recipe
    assert max(read["image_px"]) != 1288, "the family's default renders as the draft does"
