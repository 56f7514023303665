"""``ZeroJSONParser``: DRF's ``JSONParser`` with a limit on how deeply a body nests.

Python's ``json`` recurses once per level, so a few kilobytes of ``[[[[...`` raise
``RecursionError``, which DRF's parser does not catch: a 500 for a client's mistake. This
parser answers 400 (``ParseError``) for a body nesting deeper than ``max_depth`` levels,
and for one too deep for ``json`` itself. No legitimate body of these APIs nests deeply
(the query language stops at a few levels, see ``QueryParser.max_depth``).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def nesting_depth(value: Any) -> int:
    """Return how many arrays and objects nest in ``value`` (0 for a scalar).

    Iterative, so that it cannot itself run out of stack."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


class ZeroJSONParser(JSONParser):
    """Parse JSON nesting at most ``max_depth`` arrays and objects, else a 400."""

    max_depth = 32

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(self.too_deep()) from None
        if nesting_depth(data) > self.max_depth:
            raise ParseError(self.too_deep())
        return data

    def too_deep(self) -> str:
        return f"JSON parse error - the body nests deeper than {self.max_depth} levels"
