"""Cost profiles: what a decoding step of a model costs on a device (its forward by batch rows,
tree nodes per row and context length, plus the host work around the forward) and what a
picture's prefill costs by its size.

Everything that prices decoding prices it here, with `Profile.step_s` and `Profile.prefill_s`:
the planner (stages/planner.py), the load sizer (decoding/sizing.py takes `step_s` as its step
cost) and the benches' projections. A profile is measured (measured.py: `hsd profile --model M`,
or `--random-weights ARCH` for a real size built here with random weights: the cost of a forward
does not depend on the weights' values) or analytic (analytic.py: computed for a device that is
not present from its published memory bandwidth and FLOPs and the model's shapes). Formulas in
docs/method.md, "Cost profiles"; the command in command.py. Profiles are plain JSON in the user
cache.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ForwardCost:
    rows: int
    nodes: int  # tree nodes per row, all verified in the forward
    context: int  # cache entries per row before the forward
    seconds: float


@dataclass(frozen=True)
class PrefillCost:
    image_side: int  # a square page picture of this many pixels a side
    tokens: int  # prompt tokens, the image's included
    seconds: float  # the processor, the vision encoder and the prompt's forward


@dataclass(frozen=True)
class HostCost:
    """A decoding step's seconds around its forward (proposing, building the tree batch, reading
    the accepted path back, the cache edits): per_step + rows * (per_row + nodes * per_node)."""

    per_step: float = 0.0
    per_row: float = 0.0
    per_node: float = 0.0  # per row and tree node

    def seconds(self, rows: float, nodes: int) -> float:
        return self.per_step + rows * (self.per_row + nodes * self.per_node)


@dataclass(frozen=True)
class DeviceMemory:
    """What bounds the rows a device holds: its memory, the model's weights, the KV cache a token
    takes and the fixed state a row takes (a hybrid's linear-attention layers), in the profile's
    dtype (serving.rows.device_rows budgets them)."""

    device_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    state_bytes_per_row: int = 0  # a profile stored before hybrids, or a model without linear layers

    def row_bytes(self, tokens: float) -> int:
        """What a row of `tokens` cached tokens takes."""
        return round(tokens * self.kv_bytes_per_token) + self.state_bytes_per_row


def along(x: float, points: Sequence[tuple[float, float]]) -> float:
    """The price at `x` on a curve of (x, seconds) points, sorted: linear between points; past the
    last, along the last segment but never below the last point (more work never costs less, and
    a flat price past the grid would underprice it); before the first, the first point's."""
    xs, ys = zip(*points)
    if x <= xs[-1] or len(xs) == 1:
        return float(np.interp(x, xs, ys))
    slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return ys[-1] + slope * (x - xs[-1])


def square_side(width: int, height: int) -> int:
    """The side of the square picture of the same area: what a prefill is priced by (a vision
    encoder's patches, and so the image's tokens, follow the area)."""
    return round(math.sqrt(width * height))


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    device: str
    dtype: str
    kind: str  # "measured" or "analytic"
    forwards: tuple[ForwardCost, ...]
    prefills: tuple[PrefillCost, ...]
    host: HostCost = HostCost()  # a profile stored before host work was measured prices none
    memory: DeviceMemory | None = None  # None: rows unbounded by memory (a CPU; a profile stored before)
    # The host's CPU seconds to issue an eager forward's kernels (profiles/issue.py), which overlap
    # the device's work: an analytic profile's forwards are the device's time alone. 0 where the
    # forwards measured hold it (a measured profile: a CPU issues and computes in turn).
    issue_s: float = 0.0

    @cached_property
    def _forward_curves(self) -> dict[int, dict[int, list[tuple[int, float]]]]:
        """context -> rows -> the (nodes, seconds) measured: a grid may leave out its largest shapes."""
        curves: dict[int, dict[int, list[tuple[int, float]]]] = {}
        for f in sorted(self.forwards, key=lambda f: (f.context, f.rows, f.nodes)):
            curves.setdefault(f.context, {}).setdefault(f.rows, []).append((f.nodes, f.seconds))
        return curves

    def forward_s(self, rows: float, nodes: int, context: int) -> float:
        """The model's forward over `rows` rows of `nodes` tree nodes after `context` cache
        entries: along nodes at each rows of the grid, then along rows, then along context."""

        def at_context(by_rows: dict[int, list[tuple[int, float]]]) -> float:
            return along(rows, [(r, along(nodes, curve)) for r, curve in by_rows.items()])

        return along(context, [(c, at_context(by_rows)) for c, by_rows in self._forward_curves.items()])

    def step_s(self, rows: float, nodes: int, context: int) -> float:
        """A decoding step of an eager loop: the forward (the longer of the device's work and its
        issue on the host) and the host work around it."""
        return max(self.forward_s(rows, nodes, context), self.issue_s) + self.host.seconds(rows, nodes)

    def _along_area(self, image_side: int, value: str) -> float:
        prefills = sorted(self.prefills, key=lambda p: p.image_side)
        return along(image_side**2, [(p.image_side**2, getattr(p, value)) for p in prefills])

    def prefill_s(self, image_side: int) -> float:
        """A picture's prefill, by the side of a square of its area (`square_side`), linear in the area."""
        return self._along_area(image_side, "seconds")

    def prefill_tokens(self, image_side: int) -> int:
        return round(self._along_area(image_side, "tokens"))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        if data["kind"] == "analytic" and "issue_s" not in data:
            raise ValueError(f"{data['name']} was computed with a fixed launch cost per forward, before the issue time was "
                             "measured: compute it again with `hsd profile --analytic`")
        return cls(**{
            **data, "forwards": tuple(ForwardCost(**f) for f in data["forwards"]),
            "prefills": tuple(PrefillCost(**p) for p in data["prefills"]), "host": HostCost(**data.get("host", {})),
            "memory": DeviceMemory(**data["memory"]) if data.get("memory") else None,
        })


def profiles_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hsd" / "profiles"


def profile_name(model: str, device: str, dtype: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{Path(model).name or model}-{device}-{dtype}").strip("-")


def save_profile(profile: Profile) -> Path:
    path = profiles_dir() / f"{profile.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_json(), indent=1))
    return path


def load_profile(name: str) -> Profile:
    """A stored profile by name, or a JSON file."""
    path = Path(name) if name.endswith(".json") else profiles_dir() / f"{name}.json"
    return Profile.from_json(json.loads(path.read_text()))
