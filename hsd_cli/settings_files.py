"""What reading hsd's two kinds of TOML settings file shares: where the user's files are, how a
file is read, and the error for a file that cannot be used. The convert options' config files are
read in settings.py, the model families' settings in models/family_settings.py."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any


class SettingsFileError(ValueError):
    """A settings file that cannot be used; the message names the file and what is wrong."""


def user_config_dir() -> Path:
    """hsd's directory in the user's config home: `$XDG_CONFIG_HOME/hsd`, default `~/.config/hsd`."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hsd"


def read_toml(path: Path | Traversable, kind: str) -> dict[str, Any]:
    """The file's TOML document; `kind` names the sort of file in the errors ("config", ...)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsFileError(f"cannot read {kind} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SettingsFileError(f"cannot read {kind} {path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsFileError(f"bad TOML in {kind} {path}: {exc}") from None


def unknown_keys(table: dict[str, Any], known: Iterable[str]) -> str:
    """The table's keys that are not in `known`, sorted and comma-separated ("" for none)."""
    return ", ".join(sorted(set(table).difference(known)))
