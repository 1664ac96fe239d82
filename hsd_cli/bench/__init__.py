"""Benchmark commands (leaves: nothing imports them)."""

import typer

from .acceptance import acceptance
from .decode import decode
from .kv_traffic import kv_traffic
from .pipeline_arms import pipeline
from .prompt_tokens import prompt_tokens
from .render_diff import render_diff
from .repetition import repetition
from .throughput import throughput
from .two_step import two_step

bench_app = typer.Typer(name="bench", help="Measure decoding speed against plain decoding, and acceptance in a real model's tokens.", no_args_is_help=True)


@bench_app.callback()
def bench() -> None:
    """Benchmarks; every speed figure is measured against plain decoding in the same process."""


bench_app.command("decode")(decode)
bench_app.command("kv-traffic")(kv_traffic)
bench_app.command("acceptance")(acceptance)
bench_app.command("pipeline")(pipeline)
bench_app.command("prompt-tokens")(prompt_tokens)
bench_app.command("render-diff")(render_diff)
bench_app.command("repetition")(repetition)
bench_app.command("throughput")(throughput)
bench_app.command("two-step")(two_step)
