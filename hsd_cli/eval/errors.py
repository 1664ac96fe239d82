"""The one error type of the scorers: bad input that the CLI reports in one line with exit code 2."""


class EvalInputError(ValueError):
    """Missing or malformed benchmark input (test file, ground truth, output directory)."""


def missing_dependency(exc: ImportError, what: str) -> EvalInputError:
    """The one-line error for a scorer whose optional dependencies are not installed."""
    return EvalInputError(
        f"{what} needs the Python package {exc.name or exc}, which is not installed "
        "(install the eval extra, as the README says: pip install 'hsd-cli[eval]', "
        "then pip install --no-deps olmocr==0.4.27)"
    )
