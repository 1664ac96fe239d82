"""Continuous batching for callers on several threads: each caller's `decode_batch` joins the one
running batch, and its requests' rows share forwards with every other caller's.

A page scheduler runs a page per thread (its stages call `decode_batch` as they would alone);
the engine's thread admits each call's requests together when the batch has room for them
(first come, first admitted), steps all rows, and hands each call its results when its last row
ends. A call's rows start together and step together, so what one row drafts another (`feeds`)
arrives at the same step as when the call decodes alone; with a sizer priced at a fixed load
(`LoadSizer(batch_rows=...)`), a call's tokens and counts are those it gets alone.

A call whose prefill raises fails alone; a step that raises fails every call in the batch (their
rows shared the forward), and the engine goes on with an empty batch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .loop import DecodeResult, RunningBatch, Target
from .sequence import DecodeConfig, DecodeRequest, DecodeSequence
from .sizing import LoadSizer


@dataclass(eq=False)  # calls are told apart by identity
class _Call:
    """One caller's requests, keyed in the batch from `first_key` on."""

    sequences: dict[int, DecodeSequence]
    results: list[DecodeResult | None]
    first_key: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def take(self, key: int, result: DecodeResult) -> None:
        self.results[key - self.first_key] = result
        if all(r is not None for r in self.results):
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class BatchingEngine:
    """One target's running batch of at most `max_rows` rows (a call with more rows is admitted
    alone into an empty batch), served to callers on any thread."""

    def __init__(self, target: Target, config: DecodeConfig, *, max_rows: int, separate_prefill: bool = True) -> None:
        self.target = target
        self.config = config
        self.max_rows = max_rows
        self.separate_prefill = separate_prefill
        self._waiting: deque[_Call] = deque()
        self._calls: dict[int, _Call] = {}  # by batch key: the call each row in the batch answers
        self._next_key = 0
        self._changed = threading.Condition()
        # Held for each round of admissions and a step: `exclusive` holds it to use the model
        # outside the batch (plain `generate`).
        self._model = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    def decode_batch(self, requests: Sequence[DecodeRequest], *, sizer: LoadSizer | None = None) -> list[DecodeResult]:
        """`loop.decode_batch` of these requests inside the shared batch: results in request
        order. Blocks until the last of them ends; raises what their prefill or a step raised."""
        if not requests:
            return []
        with self._changed:
            if self._closed:
                raise RuntimeError("the batching engine is closed")
            first = self._next_key
            self._next_key += len(requests)
            sequences = {
                first + index: DecodeSequence(request, index, sizer, None if request.feeds is None else first + request.feeds)
                for index, request in enumerate(requests)
            }
            call = _Call(sequences, [None] * len(requests), first)
            self._waiting.append(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hsd-batching-engine", daemon=True)
                self._thread.start()
            self._changed.notify()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.results

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The model to oneself between two steps of the batch (which waits meanwhile)."""
        with self._model:
            yield

    def close(self) -> None:
        """Stop the engine's thread once the calls in flight have ended."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()

    def _admissible(self, rows: int) -> list[_Call]:
        """The waiting calls that join now, first come first: as many as fit beside `rows`."""
        admitted: list[_Call] = []
        while self._waiting:
            size = len(self._waiting[0].sequences)
            if rows and rows + size > self.max_rows:
                break
            admitted.append(self._waiting.popleft())
            rows += size
        return admitted

    def _run(self) -> None:
        batch = RunningBatch(self.target, self.config, self.separate_prefill)
        while True:
            with self._changed:
                while not self._waiting and not batch and not self._closed:
                    self._changed.wait()
                if self._closed and not self._waiting and not batch:
                    return
                admitted = self._admissible(len(batch))
            with self._model:
                for call in admitted:
                    try:
                        ended = batch.admit(call.sequences)
                    except Exception as exc:  # noqa: BLE001 - a page whose prefill raises fails alone
                        call.fail(exc)
                        continue
                    self._calls |= dict.fromkeys(call.sequences, call)
                    self._hand_back(ended)
                if not batch:
                    continue
                try:
                    self._hand_back(batch.step())
                except Exception as exc:  # noqa: BLE001 - every call in the batch shared the forward
                    for call in {id(call): call for call in self._calls.values()}.values():
                        call.fail(exc)
                    self._calls.clear()
                    batch = RunningBatch(self.target, self.config, self.separate_prefill)

    def _hand_back(self, ended: list[tuple[int, DecodeResult]]) -> None:
        for key, result in ended:
            self._calls.pop(key).take(key, result)
