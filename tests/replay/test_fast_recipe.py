"""The fast recipe (the vision tower kept at its initialisation, its features computed once) and
replay models by name (presets): on pages the tests make themselves, never the shared corpus."""

import json
from dataclasses import replace

import pymupdf
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.models.tiny import QWEN_TOKENS, build_tiny_tokenizer
from hsd_cli.replay import replay_app
from hsd_cli.replay.build import _encoded
from hsd_cli.replay.dataset import DATA_DIR, load_examples
from hsd_cli.replay.model import TINY_SHAPE, new_model, with_image_features
from hsd_cli.replay.presets import (
    FAST_RECIPE,
    PRESETS,
    ReplayModelNotBuilt,
    default_model_dir,
    preset_recipe,
    resolve_model,
)
from hsd_cli.replay.train import _answer_logits, _collate
from tests.conftest import run_hsd

from .two_pages import build_two_page_model

FAST = {"train_vision": False, "opening_steps": 0, "first_weight": 0.0, "batch_tokens": 256}


def test_a_fixed_tower_build_reproduces_its_pages_over_the_whole_vocabulary(tmp_path):
    """Trained over the used ids with the tower fixed, saved over every id: the build's own
    (dense-vocabulary, teacher-forced) completion check and greedy decoding of the saved model
    over the whole tokenizer agree on every page and crop, and the tower is the seeded one."""
    layers = ("Alpha beta gamma.", "Delta epsilon zeta.")
    outputs = ("# Alpha beta gamma.\n\nOne two three four.", "Delta epsilon zeta, eta.\n\nFive six.")
    record, tokenizer = build_two_page_model(tmp_path, layers, outputs, evaluate=True, **FAST)
    training = record["training"]
    assert training["stop_reason"] == "done" and training["exact_examples"] == training["examples"]
    assert record["eval"]["exact_pages"] == 2
    assert record["eval"]["page_char_accuracy"] == 1.0 and record["eval"]["crop_char_accuracy"] in (None, 1.0)
    assert record["vocab_size"] == len(tokenizer) > 5 * record["trained_token_ids"]
    # Saved as transformers saves it (`visual.*`, `lm_head.*`); the seeded model's own keys differ.
    saved = load_file(tmp_path / "model" / "model.safetensors")
    seeded = {key.removeprefix("model."): value for key, value in new_model(TINY_SHAPE, tokenizer, seed=3).state_dict().items()}
    last = ("visual.merger.mlp.2.weight", "visual.merger.mlp.2.bias")  # standardised: rescaled, not trained
    tower = [key for key in saved if key.startswith("visual.") and key not in last]
    assert len(tower) > 10 and all(torch.equal(saved[key], seeded[key]) for key in tower)
    ratio = saved[last[0]] / seeded[last[0]]  # each output row scaled by one positive factor
    torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio))
    assert bool((ratio > 0).all())


def test_features_computed_once_give_the_logits_of_the_tower_run_each_step(replay_corpus, tmp_path):
    from hsd_cli.replay.build import BuildRequest, build
    from hsd_cli.replay.train_config import TrainConfig

    inputs, outputs = replay_corpus
    model_dir = tmp_path / "model"
    build(BuildRequest(outputs_dir=outputs, inputs_dir=inputs, model_dir=model_dir, name="features", shape=TINY_SHAPE,
                       train=TrainConfig(max_steps=1, opening_steps=0, threads=1), evaluate=False))
    processor = adapter_for("qwen2_5_vl").load_processor(str(model_dir), False)
    encoded, vocabulary = _encoded(processor, model_dir, load_examples(model_dir / DATA_DIR))
    model = new_model(TINY_SHAPE, processor.tokenizer, seed=1, vocabulary=vocabulary).eval()
    pad_id = int(vocabulary.rows(len(processor.tokenizer))[processor.tokenizer.pad_token_id])
    batch = encoded[:3]  # a page and crops: several images of different grids in one batch
    with torch.no_grad():
        inputs_run, labels = _collate(batch, pad_id)
        inputs_cached, _ = _collate(with_image_features(model, batch), pad_id)
        assert "pixel_values" not in inputs_cached
        run, _ = _answer_logits(model, inputs_run, labels)
        cached, _ = _answer_logits(model, inputs_cached, labels)
    torch.testing.assert_close(cached, run)


def test_a_preset_name_is_its_build_in_the_user_cache_or_an_error_with_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert resolve_model("Qwen/Qwen2.5-VL-7B-Instruct") == "Qwen/Qwen2.5-VL-7B-Instruct"  # not a preset: as given
    for name in PRESETS:
        with pytest.raises(ReplayModelNotBuilt, match=f"hsd replay-model build --preset {name} --corpus "):
            resolve_model(name)
    model_dir = default_model_dir("olmocr-replay-qwen2")
    model_dir.mkdir(parents=True)
    with pytest.raises(ReplayModelNotBuilt, match="has not finished.*--resume"):
        resolve_model("olmocr-replay-qwen2")
    (model_dir / "config.json").write_text("{}")
    assert resolve_model("olmocr-replay-qwen2") == str(model_dir)

    pdf = tmp_path / "doc.pdf"
    with pymupdf.open() as doc:
        doc.new_page(width=300, height=200).insert_text((30, 60), "A page.", fontsize=16)
        doc.save(pdf)
    for args in (
        ("convert", pdf, "-o", tmp_path / "out", "--model", "omnidocbench-replay-qwen2"),
        ("bench", "pipeline", pdf, "--model", "omnidocbench-replay-qwen2"),
        ("bench", "throughput", pdf, "--model", "omnidocbench-replay-qwen2"),
        ("bench", "decode", "--model", "omnidocbench-replay-qwen2"),
        ("profile", "--model", "omnidocbench-replay-qwen2"),
        ("replay-model", "eval", "omnidocbench-replay-qwen2"),
        ("replay-model", "status", "omnidocbench-replay-qwen2"),
    ):
        result = run_hsd(*args)
        assert result.exit_code in (2, 4), (args, result.output)
        assert "hsd replay-model build --preset omnidocbench-replay-qwen2 --corpus " in result.stderr, args
        assert "Traceback" not in result.stderr


def _preset_corpus(root):
    """The corpus layout the olmOCR preset reads: a two-page PDF and its published pages."""
    preset = PRESETS["olmocr-replay-qwen2"]
    (root / preset.inputs).mkdir(parents=True)
    (root / preset.outputs).mkdir(parents=True)
    with pymupdf.open() as doc:
        for page_no, text in enumerate(("First page text.", "Second page, other text."), start=1):
            doc.new_page(width=300, height=200).insert_text((30, 60), text, fontsize=16)
            (root / preset.outputs / f"doc_pg{page_no}_repeat1.md").write_text(text + "\n")
        doc.save(root / preset.inputs / "doc.pdf")


def test_build_preset_fills_in_name_card_tokenizer_and_recipe(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpus = tmp_path / "shared" / "corpus"
    _preset_corpus(corpus)
    tokenizer = build_tiny_tokenizer(QWEN_TOKENS, 1000)
    tokenizer.save_pretrained(tmp_path / "shared" / "tokenizers" / "qwen2")  # where the shared one sits
    runner = CliRunner()
    built = runner.invoke(
        replay_app,
        [
            "build", "--preset", "olmocr-replay-qwen2", "--corpus", str(corpus), "--shape", "tiny", "--steps", "2",
            "--opening-steps", "0", "--threads", "1",  # given options win over the recipe's
        ],
    )
    assert built.exit_code == 1 and "ended short of its target" in built.stderr, "two steps reproduce nothing"
    model_dir = default_model_dir("olmocr-replay-qwen2")
    record = json.loads((model_dir / "replay.json").read_text())
    preset = PRESETS["olmocr-replay-qwen2"]
    assert record["name"] == preset.name and record["source"]["description"] == preset.description
    assert record["source"]["licence"] == preset.licence
    assert record["tokenizer"] == str((tmp_path / "shared" / "tokenizers" / "qwen2").resolve())
    assert record["vocab_size"] == len(tokenizer)
    trained = record["train_config"]
    assert (trained["max_steps"], trained["opening_steps"]) == (2, 0)
    assert trained["learning_rate"] == FAST_RECIPE.learning_rate and trained["max_minutes"] is FAST_RECIPE.minutes is None
    assert {key: trained[key] for key in FAST_RECIPE.train_settings} == FAST_RECIPE.train_settings
    assert record["shape"]["text_width"] == TINY_SHAPE.text_width  # --shape tiny over the recipe's
    assert resolve_model("olmocr-replay-qwen2") == str(model_dir)

    for args, message in (
        (["--preset", "nope", "--corpus", str(corpus)], "no such preset"),
        (["--preset", "olmocr-replay-qwen2"], "--corpus"),
        (["--preset", "olmocr-replay-qwen2", "--corpus", str(tmp_path / "missing")], "not a directory"),
        (["--corpus", str(corpus)], "--preset"),
        (["--preset", "olmocr-replay-qwen2", "--corpus", str(corpus), "--vocab-size", "4096"], "Qwen2 tokenizer"),
    ):
        refused = runner.invoke(replay_app, ["build", *args, "-o", str(tmp_path / "refused")])
        assert refused.exit_code == 2 and message in refused.stderr and refused.stderr.count("\n") == 1, args
        assert not (tmp_path / "refused").exists()


def test_the_olmocr_preset_trains_with_its_own_step_budget(monkeypatch, tmp_path):
    """Its longest page needs a budget whose annealing starts later (docs/BENCHMARKS.md); the
    other options still come from the recipe. The build is stopped at once by --minutes, short of
    its target: it fails."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpus = tmp_path / "shared" / "corpus"
    _preset_corpus(corpus)
    build_tiny_tokenizer(QWEN_TOKENS, 1000).save_pretrained(tmp_path / "shared" / "tokenizers" / "qwen2")
    built = CliRunner().invoke(
        replay_app,
        ["build", "--preset", "olmocr-replay-qwen2", "--corpus", str(corpus), "--shape", "tiny", "--minutes", "0.001",
         "--opening-steps", "0", "--threads", "1"],
    )
    assert built.exit_code == 1 and "when its minutes budget ran out" in built.stderr, built.stderr
    trained = json.loads((default_model_dir("olmocr-replay-qwen2") / "replay.json").read_text())["train_config"]
    assert trained["max_steps"] == PRESETS["olmocr-replay-qwen2"].steps == 9000 != FAST_RECIPE.steps
    assert trained["learning_rate"] == FAST_RECIPE.learning_rate
    assert preset_recipe(PRESETS["omnidocbench-replay-qwen2"]) == replace(FAST_RECIPE, steps=9000)
