"""Writing Python source from templates, formatted as ruff formats it: what :mod:`opreg.authoring._packcode`
and :mod:`opreg.authoring._packfiles` write a new pack's files with."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence


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
