"""The one error type of the scorers: bad input that the CLI reports in one line with exit code 2."""


class EvalInputError(ValueError):
    """Missing or malformed benchmark input (test file, ground truth, output directory)."""
