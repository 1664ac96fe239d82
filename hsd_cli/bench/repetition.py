"""`hsd bench repetition`: the repetition guard on real pages and on the structures it must let
through, in a real model's tokens: the longest repeating span of every text, whether the guard
stops it, and how soon it stops generated loops. Heavy imports wait for the command to run."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

_COLUMNS = 64
# Repetition that real pages hold and a reading must keep (issue 31's list, in the forms models write).
LEGITIMATE_STRUCTURES = {
    "pipe table, 64 columns, separator row": "| " + " | ".join(f"Col{i}" for i in range(_COLUMNS)) + " |\n|"
    + "---|" * _COLUMNS + "\n| " + " | ".join(str(i) for i in range(_COLUMNS)) + " |\n",
    "pipe table, 64 columns, aligned separator": "|" + ":---:|" * _COLUMNS + "\n",
    "pipe table, 3 rows of 64 empty cells": ("|" + "  |" * _COLUMNS + "\n") * 3,
    "HTML table, 3 rows of 64 empty cells": "<table>" + ("<tr>" + "<td></td>" * _COLUMNS + "</tr>") * 3 + "</table>",
    "dot leader across a page": "Chapter 1 Introduction" + " ." * 100 + " 5\n",
    "table of contents, 20 dot-leader lines": "".join(f"{i}. Section {i} " + ". " * 60 + f"{i * 3}\n" for i in range(1, 21)),
    "16 x 16 zero matrix, LaTeX": "$$\\begin{bmatrix} " + " \\\\ ".join(" & ".join(["0"] * 16) for _ in range(16))
    + " \\end{bmatrix}$$",
    "16 x 16 zero matrix, pipe table": "|" + "|".join(f" c{i} " for i in range(16)) + "|\n|" + "---|" * 16 + "\n"
    + ("| " + " | ".join(["0"] * 16) + " |\n") * 16,
    "16 x 16 zero matrix, HTML": "<table>" + ("<tr>" + "<td>0</td>" * 16 + "</tr>") * 16 + "</table>",
    "numbered list, 100 items": "".join(f"{i}. Item\n" for i in range(1, 101)),
    "bullet list, 100 equal items": "- Item\n" * 100,
    "checklist, 100 empty boxes": "- [ ] \n" * 100,
    "30 lines of N/A": "N/A\n" * 30,
    # The offset changes every line, so no span longer than about two lines repeats one unit.
    "hex dump of 1 KiB of zeros, offset on each line": "".join(f"{16 * i:08x}: " + "00 " * 15 + "00\n" for i in range(64)),
}
# Repetition real pages hold past REPETITION_SPAN: the guard lets it through where the request's
# drafts hold it (issue 49), and cuts it where they do not.
DRAFTED_STRUCTURES = {
    "form of 40 empty rows, HTML": "<table><tr><th>Name</th><th>Date</th><th>Item</th><th>Qty</th><th>Price</th>"
    "<th>Signature</th></tr>" + ("<tr>" + "<td></td>" * 6 + "</tr>") * 40 + "</table>",
    "20 x 20 zero matrix, LaTeX": "$$\\begin{bmatrix} " + " \\\\ ".join(" & ".join(["0"] * 20) for _ in range(20))
    + " \\end{bmatrix}$$",
    "hex dump of 1 KiB of zeros": ("00 " * 15 + "00\n") * 64,
}
# Loops as models write them: (name, text before, unit). Each repeats to the budget.
GENERATED_LOOPS = {
    "one token": ("The total is", "0"),
    "a table row": ("| a | b |\n|---|---|\n", "| 1 | 2 |\n"),
    "an empty HTML cell": ("<table><tr>", "<td></td>"),
    "a 16-token sentence": ("Intro.\n", "The committee met again on Tuesday to discuss the new budget for next year. "),
    "a 50-token paragraph": ("Summary:\n", "In the second quarter, revenue from the northern region rose by twelve "
                             "percent while costs in the southern offices fell, as the board had hoped when it "
                             "approved the plan last autumn, and the outlook for the rest of this year is, on the whole, good. "),
}
BUDGET = 4096


def _corpus_texts(paths: list[Path]) -> Iterator[tuple[str, str]]:
    """(name, text) of every Markdown file under `paths`, and of every page of an OmniDocBench
    ground-truth JSON (its blocks' text, LaTeX and HTML)."""
    for path in paths:
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".md" and file.name != "README.md":
                yield str(file), file.read_text(encoding="utf-8", errors="replace")
            elif file.suffix == ".json" and file.name.startswith("OmniDocBench"):
                for page in json.loads(file.read_text(encoding="utf-8")):
                    parts = [det[k] for det in page.get("layout_dets", []) for k in ("text", "latex", "html") if det.get(k)]
                    yield f"{file}:{page['page_info']['image_path']}", "\n\n".join(parts)


def longest_repeating_span(tokens: list[int]) -> tuple[int, int]:
    """(tokens, unit) of the longest span that repeats one unit of up to REPETITION_MAX_UNIT tokens."""
    import numpy as np

    from hsd_cli.decoding.repetition import REPETITION_MAX_UNIT

    ids, best = np.asarray(tokens, dtype=np.int64), (0, 0)
    for unit in range(1, min(REPETITION_MAX_UNIT, len(ids) - 1) + 1):
        same = np.diff(np.concatenate(([0], (ids[unit:] == ids[:-unit]).astype(np.int8), [0])))
        if same.any():
            run = int((np.flatnonzero(same == -1) - np.flatnonzero(same == 1)).max())
            best = max(best, (run + unit, -unit))
    return best[0], -best[1]


def repetition(
    paths: Annotated[list[Path], typer.Argument(help="Markdown outputs or ground truth (directories searched), OmniDocBench GT JSON.")],
    tokenizer: Annotated[Path, typer.Option(help="The model's tokenizer directory (tokenizer.json).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    ids_out: Annotated[Path | None, typer.Option(help="Also write the structures' and loops' token ids here (test fixture).")] = None,
) -> None:
    """The repetition guard on corpus pages, legitimate structures and generated loops."""
    from tokenizers import Tokenizer

    from hsd_cli.decoding.repetition import REPETITION_SPAN, find_repetition, repetition_stop, structure_allowance

    encode = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).encode

    def row(text: str) -> dict:
        tokens = encode(text, add_special_tokens=False).ids
        span, unit = longest_repeating_span(tokens)
        loop = find_repetition(tokens)
        return {"tokens": len(tokens), "longest_span": span, "unit": unit, "stopped_at": loop.stop if loop else None}

    corpus = {name: row(text) for name, text in _corpus_texts(paths)}
    structures = {name: row(text) for name, text in LEGITIMATE_STRUCTURES.items()}
    drafted = {}
    for name, text in DRAFTED_STRUCTURES.items():  # drafted by their own text
        tokens = encode(text, add_special_tokens=False).ids
        drafted[name] = row(text) | {"stopped_drafted": repetition_stop(tokens, structure_allowance([tokens]))}
    loops, ids = {}, {"structures": {}, "drafted": {}, "loops": {}}
    for name, (before, unit) in GENERATED_LOOPS.items():
        head, unit_ids = encode(before, add_special_tokens=False).ids, encode(unit, add_special_tokens=False).ids
        tokens = (head + unit_ids * (BUDGET // len(unit_ids) + 1))[:BUDGET]
        loop = find_repetition(tokens)
        loops[name] = {"unit_tokens": len(unit_ids), "loop_start": len(head),
                       "stopped_after": loop.stop - len(head) if loop else None}
        ids["loops"][name] = {"before": head, "unit": unit_ids}
    for name, text in LEGITIMATE_STRUCTURES.items():
        ids["structures"][name] = encode(text, add_special_tokens=False).ids
    for name, text in DRAFTED_STRUCTURES.items():
        ids["drafted"][name] = encode(text, add_special_tokens=False).ids
    if ids_out:
        ids_out.write_text(json.dumps(ids) + "\n")
    fired = [name for name, r in {**corpus, **structures}.items() if r["stopped_at"] is not None]
    summary = {
        "span": REPETITION_SPAN, "texts": len(corpus), "fired_on": fired,
        "corpus_longest": max(corpus.items(), key=lambda item: item[1]["longest_span"], default=None),
        "structures": structures, "drafted": drafted, "loops": loops,
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731 - a table for humans
    log(f"guard: a span of {REPETITION_SPAN} tokens repeating one unit; {len(corpus)} corpus texts, fired on {len(fired)}")
    if summary["corpus_longest"]:
        name, longest = summary["corpus_longest"]
        log(f"corpus: longest repeating span {longest['longest_span']} tokens (unit {longest['unit']}) in {name}")
    log(f"{'structure':45s} {'tokens':>7s} {'span':>6s} {'unit':>5s}  stopped")
    for name, r in structures.items():
        log(f"{name:45s} {r['tokens']:7d} {r['longest_span']:6d} {r['unit']:5d}  {r['stopped_at'] or 'no'}")
    for name, r in drafted.items():
        log(f"{name:45s} {r['tokens']:7d} {r['longest_span']:6d} {r['unit']:5d}  {r['stopped_at'] or 'no'}"
            f" (drafted: {r['stopped_drafted'] or 'no'})")
    log(f"{'loop (repeated to ' + str(BUDGET) + ' tokens)':45s} {'unit':>7s}  stopped after (tokens from its start)")
    for name, r in loops.items():
        log(f"{name:45s} {r['unit_tokens']:7d}  {r['stopped_after']}")
    for name in fired:
        log(f"fired on: {name}")
