"""Writing Python source from templates, formatted as ruff formats it: what :mod:`opreg.authoring._packcode`
and :mod:`opreg.authoring._packfiles` write a new pack's files with.

Text that comes from the author (an op's schema, a string default) enters the source only through
:func:`literal`, as data: a template never pastes it between quotes, in a docstring or in a comment.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any


def code(text: str, **inserts: str) -> str:
    """A file's text from an indented template; each ``@NAME@`` replaced by ``inserts[NAME]`` after
    the template is dedented (an insert is text at its final indentation)."""
    text = textwrap.dedent(text).strip("\n") + "\n"
    for name, value in inserts.items():
        text = text.replace(f"@{name}@", value)
    return text


def wrap(indent: int, head: str, items: Sequence[str], closer: str, width: int = 120) -> str:
    """``head`` + items + ``closer`` at ``indent``, split as ruff's formatter splits what does not fit in
    ``width`` columns: the items on one line of their own, else one item a line with a trailing comma."""
    pad = " " * indent
    one = f"{pad}{head}{', '.join(items)}{closer}"
    if len(one) <= width:
        return one
    inner = f"{pad}    {', '.join(items)}"
    if len(inner) <= width:
        return f"{pad}{head}\n{inner}\n{pad}{closer}"
    return f"{pad}{head}\n" + "".join(f"{pad}    {item},\n" for item in items) + f"{pad}{closer}"


def block(text: str, **inserts: str) -> str:
    """A top-level definition to append to a file: two blank lines, then the template (:func:`code`)."""
    return "\n\n" + code(text, **inserts)


def literal(value: Any) -> str:
    """``value`` (str, int, float, bool, None, or a list of them) as Python source that evaluates to it,
    from :func:`repr`, in double quotes where ruff's formatter would choose them."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'  # repr(inf) is not source
    if not isinstance(value, (str, int, float, bool)) and value is not None:
        raise TypeError(f"no Python literal for {type(value).__name__}")
    text = repr(value)
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        return f'"{text[1:-1]}"'  # no quote inside: repr's body is the same in double quotes
    return text
