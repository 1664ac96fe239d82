"""The scorers' errors, which the CLI reports in one line: bad input (exit 2), environment (exit 4)."""


class EvalInputError(ValueError):
    """Missing or malformed benchmark input (test file, ground truth, output directory)."""


class EvalEnvironmentError(RuntimeError):
    """The machine cannot score as asked, e.g. no KaTeX renderer under --require-math-render."""


def missing_dependency(exc: ImportError, what: str) -> EvalInputError:
    """The one-line error for a scorer whose optional dependencies are not installed."""
    return EvalInputError(
        f"{what} needs the Python package {exc.name or exc}, which is not installed "
        "(install the eval extra, as the README says: pip install 'hsd-cli[eval]', "
        "then pip install --no-deps olmocr==0.4.27)"
    )
