"""`--convert`: run `hsd convert` into OUTDIR first, so every stage and backend is scored alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from hsd_cli.config import ConvertConfig, DraftBackendName, RunConfig, Stages, UsageError
from hsd_cli.eval.errors import EvalInputError


@dataclass(frozen=True)
class ConvertRequest:
    inputs: Path
    output_dir: Path
    stages: Stages = Stages.AUTO
    draft_backend: DraftBackendName = DraftBackendName.AUTO


def convert_inputs(request: ConvertRequest, console: Console) -> dict[str, Any]:
    """Convert with the converter's own runner (documents already done in OUTDIR are kept)."""
    from hsd_cli.output.manifest import OutputLockedError
    from hsd_cli.batch.reporting import Reporter
    from hsd_cli.batch.runner import ExitCode, run_convert

    if not request.inputs.exists():
        raise EvalInputError(f"--inputs not found: {request.inputs}")
    try:
        config = ConvertConfig(
            output_dir=request.output_dir, stages=request.stages, draft_backend=request.draft_backend
        )
        code, summary = run_convert([str(request.inputs)], config, RunConfig(), Reporter(console=console, quiet=True))
    except (UsageError, OutputLockedError) as exc:
        raise EvalInputError(f"conversion could not run: {exc}") from None
    if code is ExitCode.NO_INPUT:
        raise EvalInputError(f"no PDF or image found under --inputs {request.inputs}")
    if code is not ExitCode.OK:
        console.print(f"[yellow]warning:[/yellow] conversion ended with {code.name}; pages it lost fail their tests")
    return {
        "inputs": str(request.inputs),
        "stages": request.stages.value,
        "draft": request.draft_backend.value,
        "exit_code": int(code),
        "counts": summary.get("counts"),
        "seconds": summary.get("seconds"),
    }
