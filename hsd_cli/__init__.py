"""hsd: batch PDF to Markdown/JSON conversion with hierarchical speculative decoding."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hsd-cli")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
