"""Character error rate of Markdown output against known plain text."""

import re

from rapidfuzz.distance import Levenshtein

_MARKUP = re.compile(r"^\|?(\s*:?-{3,}:?\s*\|)+\s*$|<!--.*?-->|^#+\s|^\s*[-*]\s|\*\*|\|", re.MULTILINE)


def plain(markdown: str) -> str:
    return " ".join(_MARKUP.sub(" ", markdown).split())


def cer(markdown: str, reference: str) -> float:
    reference = " ".join(reference.split())
    return Levenshtein.distance(plain(markdown), reference) / len(reference)
