"""Options are resolved once, in the parent, before any worker starts (batch.resolve,
serving.resolve): a task carries them whole (config.ResolvedConfig), and nothing on the worker's
side sets a default for an option the parent resolves. These tests fail when a worker-side module
reads the raw options or calls one of the resolvers, and when the worker's model does not use
exactly the values it was given."""

import ast
import types
import typing
from dataclasses import fields
from pathlib import Path

import hsd_cli
from hsd_cli.config import ModelConfig, ResolvedConfig, ScheduleConfig
from tests.fixtures import model_config

PACKAGE = Path(hsd_cli.__file__).parent
# The modules that run in a worker (a process, a Ray actor) or a draft process.
WORKER_SIDE = (
    "document/", "stages/", "serving/model.py", "serving/reader.py", "serving/pipeline_lock.py", "batch/worker.py",
    "batch/shared_worker.py", "document/draft_processes.py", "output/",
)
# The raw options and what turns them into resolved ones: the parent's alone.
RESOLVERS = {
    "ConvertConfig", "RunConfig", "resolve_model", "resolve_schedule", "default_rows", "drafting_processes",
    "default_device", "default_dtype", "default_draft_processes", "device_rows_choice", "profile_name",
}
# Fields whose None is a value (no profile, no wrapper, lossless, the DynamicCache), not "a default to choose later".
NONE_IS_A_VALUE = {"profile", "reader_wrapper", "near_lossless", "layout_model", "kv_store_slots"}


def worker_side_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if str(path.relative_to(PACKAGE)).startswith(WORKER_SIDE))


def names_used(source: str) -> set[str]:
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            used.update(alias.asname or alias.name.split(".")[-1] for alias in node.names)
    return used


def resolvers_used() -> dict[str, set[str]]:
    found = {}
    for path in worker_side_modules():
        if used := names_used(path.read_text(encoding="utf-8")) & RESOLVERS:
            found[str(path.relative_to(PACKAGE))] = used
    return found


def test_no_worker_side_module_reads_the_raw_options_or_resolves_a_default():
    assert len(worker_side_modules()) > 20
    assert resolvers_used() == {}


def test_a_worker_side_default_added_by_hand_is_found():
    source = "def budget(options, settings):\n    return options.max_new_tokens or default_dtype('cpu')\n"
    assert names_used(source) & RESOLVERS == {"default_dtype"}
    assert names_used("from hsd_cli.config import ConvertConfig\n") & RESOLVERS == {"ConvertConfig"}


def test_the_resolved_configs_hold_no_default_left_to_choose():
    """No field of what the parent resolves may be None (a None would be a default a worker fills in)."""
    for config in (ModelConfig, ScheduleConfig, ResolvedConfig):
        hints = typing.get_type_hints(config)
        optional = {
            f.name for f in fields(config)
            if isinstance(hints[f.name], types.UnionType) and type(None) in hints[f.name].__args__
        }
        allowed = NONE_IS_A_VALUE | ({"model"} if config is ResolvedConfig else set())
        assert optional <= allowed, (config.__name__, optional - allowed)


def test_the_worker_model_reads_with_exactly_the_resolved_values(tiny_model):
    """A budget, dtype and device given (or resolved) in the parent are the ones the model reads
    with; the family settings' own budget is not consulted again in the worker."""
    from hsd_cli.models.family_settings import settings_for
    from hsd_cli.serving.model import VlmModel

    config = model_config(tiny_model, dtype="float32", max_new_tokens=7)
    assert config.device == "cpu" and config.profile is None
    assert settings_for(config.family).max_new_tokens != 7
    model = VlmModel(config)
    assert model.decode_config.max_new_tokens == 7
    assert str(model.target.dtype) == "torch.float32" and str(model.target.device) == "cpu"
    assert model.profile is None and model.engine is None
