"""What the run's worker pools take, in turn, and the documents split into parts on the way."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from hsd_cli.document.inputs import InputDocument, OutputPaths
from hsd_cli.document.tasks import DocumentOutcome, DocumentTask


@dataclass
class SplitDocument:
    """A document in conversion: into how many parts it split (config.document_parts; 1: it did
    not), and the outcomes of its parts so far."""

    index: int  # in input order
    key: str
    task: DocumentTask
    started: float  # time.monotonic()
    parts: int = 1
    outcomes: list[DocumentOutcome] = field(default_factory=list)
    taking: threading.Lock = field(default_factory=threading.Lock)

    def take(self, outcome: DocumentOutcome) -> bool:
        """Keep a part's outcome; whether it was the last part out."""
        with self.taking:
            self.outcomes.append(outcome)
            return len(self.outcomes) == self.parts


@dataclass(frozen=True)
class Part:
    document: SplitDocument
    part: int


class Schedule:
    """What the run's pools take, in turn: the later parts of split documents first (a long
    document's pages share the model's rows), then the next document in input order."""

    def __init__(self, planned: list[tuple[InputDocument, OutputPaths]], parts: int, cancelled: threading.Event) -> None:
        self.parts = parts  # into how many parts a document may split (1: none)
        self.todo = iter(enumerate(planned))
        self.cancelled = cancelled
        self.queued: deque[Part] = deque()
        # Documents whose first part runs and has not yet said into how many parts it splits: a
        # pool with nothing to take waits for them rather than end.
        self.splitting: set[int] = set()
        self.changed = threading.Condition()

    def take(self) -> Part | tuple[int, tuple[InputDocument, OutputPaths]] | None:
        with self.changed:
            while not self.cancelled.is_set():
                if self.queued:
                    return self.queued.popleft()
                item = next(self.todo, None)
                if item is not None:
                    if self.parts > 1:
                        self.splitting.add(item[0])
                    return item
                if not self.splitting:
                    return None
                self.changed.wait(0.25)
            return None

    def split(self, document: SplitDocument, parts: int) -> None:
        """The document's first part says into how many parts it splits; a resent first part says
        it again, which changes nothing."""
        with self.changed:
            if document.index not in self.splitting:
                return
            document.parts = parts
            self.queued.extend(Part(document, part) for part in range(1, parts))
            self.splitting.discard(document.index)
            self.changed.notify_all()

    def settled(self, index: int) -> None:
        """The document's first part is over, split or not."""
        with self.changed:
            self.splitting.discard(index)
            self.changed.notify_all()


