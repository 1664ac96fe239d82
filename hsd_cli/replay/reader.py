"""A replay model's reader: the model's own, and a note on every page the replay model was not
built on (it recites another page there). `hsd convert` names it in ModelConfig.reader_wrapper,
so that the product never imports the benchmark stand-ins."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from PIL import Image

from hsd_cli.config import ConvertConfig, ModelConfig
from hsd_cli.records.kinds import ReaderNote
from hsd_cli.replay.fingerprint import ReplayPages, replay_pages, replay_recipe
from hsd_cli.serving.reader import Reader

WRAPPER = f"{__name__}:ReplayReader"
OUTSIDE_REPLAY_SET = ReaderNote(
    "outside_replay_set",
    "the replay model was not built on this page; its output recites another page and is not a reading of this one",
)


def as_built(config: ConvertConfig) -> ConvertConfig:
    """`config` reading a replay model with the makers' recipe it was built on (that of the model
    it stands for), unless --recipe names one."""
    built_on = replay_recipe(config.model) if config.model is not None and config.recipe is None else None
    return replace(config, recipe=built_on) if built_on else config


def reader_wrapper(model: str) -> str | None:
    """The wrapper for `model` where it is a replay model's directory, else None."""
    return WRAPPER if replay_pages(model) is not None else None


class ReplayReader:
    """The model's reader, flagging the pages outside the replay set."""

    def __init__(self, reader: Reader, config: ModelConfig) -> None:
        self.reader = reader
        self.pages: ReplayPages | None = replay_pages(config.model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)

    def page_note(self, picture: Image.Image) -> ReaderNote | None:
        return OUTSIDE_REPLAY_SET if self.pages is not None and not self.pages(picture) else None
