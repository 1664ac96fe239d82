"""The run manifest under OUT/.hsd/: one appended record per document attempt; resume decisions.

A record is appended only after the document's outputs exist, so a record with status ok always
points at a complete output set. Records are keyed by the output path relative to OUT (unique per
document by construction); the newest record for a key wins.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsd_cli.records.kinds import DocStatus

STATE_DIR = ".hsd"


class OutputLockedError(RuntimeError):
    """Another hsd process holds the output directory."""


@dataclass(frozen=True)
class ResumeDecision:
    run: bool
    reason: str = ""  # why it is not converted now
    # A failure stays a failure until retried, so a re-run does not turn it into exit code 0.
    status: DocStatus = DocStatus.SKIPPED
    error: str | None = None


class Manifest:
    def __init__(self, output_dir: Path) -> None:
        self.state_dir = output_dir / STATE_DIR
        self.path = self.state_dir / "manifest.jsonl"
        self._latest: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a crash mid-append: that attempt never finished
                self._latest[record["key"]] = record

    def decide(
        self, key: str, sha256: str, config_hash: str, model: str | None, overwrite: bool, retry_failed: bool
    ) -> ResumeDecision:
        """Whether the document whose outputs live at `key` (relative to OUT) must be converted."""
        record = self._latest.get(key)
        if overwrite or record is None:
            return ResumeDecision(True)
        same = (record.get("sha256"), record.get("config_hash"), record.get("model")) == (sha256, config_hash, model)
        if not same:
            return ResumeDecision(True)
        status = DocStatus(record["status"])
        if status in (DocStatus.OK, DocStatus.DEGRADED):
            outputs = record.get("outputs", {})
            if outputs and all(Path(p).exists() for key, p in outputs.items() if key != "images"):
                return ResumeDecision(False, f"already converted ({status.value})")
            return ResumeDecision(True)
        if status.is_failure and not retry_failed:
            return ResumeDecision(
                False, "not retried (--retry-failed redoes it)", status, f"{record.get('error')} [earlier run]"
            )
        return ResumeDecision(True)

    def append(self, record: dict[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self._latest[record["key"]] = record


class OutputLock:
    """An exclusive lock on OUT/.hsd/lock for the length of a run."""

    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / STATE_DIR / "lock"
        self._handle = None

    def __enter__(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise OutputLockedError(
                f"another hsd run (pid {holder}) is writing to {self.path.parent.parent}"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def remove_stale_temp_files(output_dir: Path) -> int:
    """Delete temp files that a killed run left behind (our atomic writes name them `.X.*.tmp`)."""
    removed = 0
    if output_dir.exists():
        for path in output_dir.rglob(".*.tmp"):
            if STATE_DIR not in path.relative_to(output_dir).parts[:1]:
                path.unlink(missing_ok=True)
                removed += 1
    return removed
