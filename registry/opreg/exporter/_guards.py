"""What torch.export decides about sizes while it captures: size-oblivious reasoning, and where
each shape guard comes from.

:func:`size_oblivious` is torch's ``backed_size_oblivious`` setting, as ``torch.onnx`` captures
and decomposes with it: a dim marked dynamic whose example size is 0 or 1 gets a symbol like any
other (without it torch fixes it, "0/1 specialized"), and where torch cannot tell whether a size
is 1 it takes the general path. It is a process-wide setting, patched through torch's config API
(restored on exit, on an error too) while :data:`opreg.exporter._capture.TRACING_LOCK` is held.

:class:`GuardSites` records where each guard was added. The shape environment keeps a guard's
expression and the innermost frame outside torch's tracing machinery, which for a guard torch's
own code adds (``expand``'s check that a size is 1, in ``torch/_refs``) is a line of torch. The
frame a user can act on is the innermost one outside torch: the model's, or its library's. The
shape environment announces each guard on its logger (``TORCH_LOGS=dynamic``); a filter on that
logger reads the stack there, and passes on only what the logger would have shown without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

import torch

SHAPES_LOGGER = "torch.fx.experimental.symbolic_shapes"
"""The logger torch's shape environment announces guards on (``TORCH_LOGS=dynamic``)."""

_GUARD_ADDED = "[guard added]"
_CREATED = "create_symbol %s = %s for %s"
_TORCH = os.path.dirname(torch.__file__) + os.sep
_HERE = (os.path.dirname(logging.__file__) + os.sep, contextlib.__file__)
_EXPORTER = os.path.dirname(os.path.abspath(__file__)) + os.sep


@contextlib.contextmanager
def size_oblivious(enabled: bool = True) -> Iterator[None]:
    """torch's ``backed_size_oblivious`` on while inside (see the module docstring); nothing with
    ``enabled`` false, or in a torch without the setting."""
    config = _config()
    if not enabled or config is None:
        yield
        return
    with config.patch(backed_size_oblivious=True):
        yield


SIZE_OBLIVIOUS_KEY = "opreg.size_oblivious"
"""Set in a captured program's ``graph_module.meta`` when it was captured size-obliviously."""


def captured_size_oblivious(program: torch.export.ExportedProgram) -> bool:
    """Whether ``program`` was captured with :func:`size_oblivious` (its decomposition then is too)."""
    return bool(program.graph_module.meta.get(SIZE_OBLIVIOUS_KEY, False))


def size_oblivious_now() -> bool:
    """Whether torch's ``backed_size_oblivious`` is on (what tests check is restored)."""
    config = _config()
    return bool(config is not None and config.backed_size_oblivious)


def _config() -> Any:
    try:
        import torch.fx.experimental._config as config
    except ImportError:
        return None
    return config if hasattr(config, "backed_size_oblivious") else None


def where(filename: str, line: int, function: str) -> str:
    """``file:line in function``, the file relative to site-packages or the working folder."""
    return f"{_relative(filename)}:{line} in {function}"


def located(text: str, source: str) -> str:
    """``text``, then `` (source)`` when the place it came from is known (:func:`where`): how a
    fixed dim, a grown dim and a shape guard name the model's line."""
    return f"{text} ({source})" if source else text


def _relative(filename: str) -> str:
    """``filename`` relative to site-packages or the working folder, where it is under one."""
    marker = f"site-packages{os.sep}"
    if marker in filename:
        return filename.split(marker, 1)[1]
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            return relative
    return filename


def _outside_torch(filename: str) -> bool:
    """Whether ``filename`` may be code of the model or its library: not torch's, not logging's,
    not code torch generates (``<string>``, ``<eval_with_key>.3``); opreg's exporter is, and a
    frame of it means no model code was running."""
    return not filename.startswith((_TORCH, "<", *_HERE))


def in_torch(filename: str) -> bool:
    """Whether ``filename`` is one of torch's own files."""
    return filename.startswith(_TORCH)


def user_line(error: BaseException) -> str:
    """Where ``error`` was raised from the model's code (or its library's), or ``""``."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if _outside_torch(f.filename)]
    if not frames or frames[-1].filename.startswith(_EXPORTER):
        return ""
    last = frames[-1]
    return where(last.filename, last.lineno or 0, last.name)


@dataclasses.dataclass(frozen=True)
class GuardSite:
    """Where one guard was added.

    Fields:
        expression: torch's expression of the guard, in its symbols (``Eq(s77, 1)``).
        user: the innermost frame outside torch when it was added (``model.py:12 in forward``),
            ``""`` when there was none.
    """

    expression: str
    user: str


class GuardSites(logging.Filter):
    """Records a :class:`GuardSite` for each guard torch adds in this thread while inside (a
    context manager), and the source of each symbol it creates; the shape environment's logger
    shows what it showed before."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[GuardSite] = []
        self.sources: dict[str, str] = {}
        """torch's symbol -> the source it stands for (``s77`` -> ``L['x'].size()[0]``)."""
        self._thread = threading.get_ident()
        self._shown = logging.WARNING
        self._level = logging.NOTSET

    def __enter__(self) -> GuardSites:
        logger = logging.getLogger(SHAPES_LOGGER)
        self._shown = logger.getEffectiveLevel()
        self._level = logger.level
        logger.addFilter(self)
        if self._shown > logging.INFO:
            logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(SHAPES_LOGGER)
        logger.removeFilter(self)
        if self._shown > logging.INFO:
            logger.setLevel(self._level)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread == self._thread:
            message = str(record.msg)
            if _GUARD_ADDED in message:
                expression = _expression(record)
                if expression:
                    self.sites.append(GuardSite(expression, _user_frame(sys._getframe(1))))
            elif message.startswith(_CREATED) and isinstance(record.args, tuple) and len(record.args) > 2:
                self.sources[str(record.args[0])] = str(record.args[2])  # "create_symbol s77 = 1 for L['x']..."
        return record.levelno >= self._shown

    def first(self, expression: str) -> str:
        """Where the guard ``expression`` was first added (its user frame), or ``""``."""
        return next((site.user for site in self.sites if site.expression == expression and site.user), "")


def _expression(record: logging.LogRecord) -> str:
    """The guard a "guard added" record announces: the argument before the marker."""
    args = record.args if isinstance(record.args, tuple) else ()
    parts = str(record.msg).split()
    try:
        index = parts.index(_GUARD_ADDED.split(maxsplit=1)[0])  # "%s %s [guard added] ...": the 2nd argument
    except ValueError:
        return ""
    return str(args[index - 1]) if 0 < index <= len(args) else ""


def _user_frame(frame: FrameType | None) -> str:
    while frame is not None:
        code = frame.f_code
        if _outside_torch(code.co_filename):
            return (
                "" if code.co_filename.startswith(_EXPORTER) else where(code.co_filename, frame.f_lineno, code.co_name)
            )
        frame = frame.f_back
    return ""


_SQUEEZES = ("squeeze.default", "squeeze.dim", "squeeze.dims", "squeeze_.default", "squeeze_.dim", "squeeze_.dims")


def kept_squeezes(
    program: torch.export.ExportedProgram, names: dict[str, str]
) -> list[tuple[str, tuple[str, ...], str]]:
    """The dims a ``squeeze`` of a size-oblivious capture kept that eager PyTorch removes at the
    example: a dim marked dynamic of example size 1 is not known to be 1, so torch keeps it, without
    a guard; at size 1 the ONNX model then has a dim eager's output has not. One ``(guard, dims,
    source)`` each (``x.shape[0] != 1``, ``("x.shape[0]",)``, the model's line); ``names``: torch's
    symbol -> the input dim it stands for (``s77`` -> ``x.shape[0]``)."""
    if not captured_size_oblivious(program):
        return []
    found = []
    for node in program.graph.nodes:
        name = str(node.target).removeprefix("aten.")
        value = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if node.op != "call_function" or name not in _SQUEEZES or not isinstance(value, torch.Tensor):
            continue
        dims = node.args[1] if len(node.args) > 1 else range(value.dim())
        for dim in [dims] if isinstance(dims, int) else dims:
            size = value.shape[dim]
            symbol = str(size.node.expr) if isinstance(size, torch.SymInt) else ""
            if symbol in names and size.node.hint == 1:  # kept, where eager squeezes the example's 1
                guard = f"{names[symbol]} != 1 (a squeeze keeps the dim, which eager PyTorch removes at size 1)"
                found.append((guard, (names[symbol],), _node_line(node)))
    return found


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


def _node_line(node: torch.fx.Node) -> str:
    """Where the model's code (or its library's) made ``node``: the innermost such frame of its
    stack trace, or ``""``."""
    frames = [m for m in _FRAME.finditer(node.meta.get("stack_trace") or "") if _outside_torch(m["file"])]
    if not frames or frames[-1]["file"].startswith(_EXPORTER):
        return ""
    return where(frames[-1]["file"], int(frames[-1]["line"]), frames[-1]["function"])


# -- names of torch's size symbols -------------------------------------------------------------


_SIZE = re.compile(r"^L\[['\"](?P<name>[^'\"]+)['\"]\](?P<rest>.*)\.size\(\)\[(?P<dim>\d+)\]$")


def input_of(source: Any) -> tuple[str, int] | None:
    """The input path and dim a shape symbol's source names (``L['x'].size()[0]`` -> ``("x", 0)``),
    spelled as :func:`opreg.exporter._capture.dynamic_dims` spells paths; a source or its name."""
    match = _SIZE.match(source if isinstance(source, str) else str(getattr(source, "name", "")))
    if match is None:
        return None
    return match.group("name") + match.group("rest"), int(match.group("dim"))


def names_in(env: Any) -> dict[str, str]:
    """torch's symbol -> the input dim it stands for (``s77`` -> ``x.shape[0]``), from the shape
    environment."""
    names = {}
    for symbol, sources in (getattr(env, "var_to_sources", None) or {}).items():
        where = next((w for w in map(input_of, sources) if w is not None), None)
        if where is not None:
            names[str(symbol)] = f"{where[0]}.shape[{where[1]}]"
    return names


def render(expr: Any, names: Mapping[str, str]) -> str:
    """A guard or size as Python reads it, its symbols named after the inputs (``x.shape[0] == 1``):
    a sympy expression, or the text torch prints for one."""
    text = str(expr)
    for symbol in sorted(set(re.findall(r"\bs\d+\b", text)), key=len, reverse=True):
        if symbol in names:
            text = re.sub(rf"\b{symbol}\b", names[symbol], text)
    equation = re.fullmatch(r"(Eq|Ne)\((.+), ([^,()]+)\)", text)
    if equation is not None:
        return f"{equation.group(2)} {'==' if equation.group(1) == 'Eq' else '!='} {equation.group(3)}"
    return text


# -- guards true at every size ------------------------------------------------------------


def holds(expr: Any, ranges: Mapping[Any, Any]) -> bool:
    """Whether the guard ``expr`` is true at every size in ``ranges``: torch's bounds prove it, or
    sympy's ``Mod`` does, which torch's does not (``3*w*b*(h + 2) % (w*(3*h + 6)) == 0``), or sympy
    does with the sizes positive (``min(16*p + 16*s, 32*p + 32*s) == 16*p + 16*s``, from
    transformers' ``repeat_kv``, which torch's interval bounds cannot relate)."""
    import sympy
    from torch.utils._sympy.functions import Mod, PythonMod
    from torch.utils._sympy.value_ranges import bound_sympy

    with contextlib.suppress(Exception):  # torch cannot bound it: it may narrow the dims
        bounds = bound_sympy(expr, ranges)
        if bounds.lower == bounds.upper and bool(bounds.lower):
            return True
    with contextlib.suppress(Exception):
        if expr.replace(lambda e: isinstance(e, (Mod, PythonMod)), lambda e: sympy.Mod(*e.args)) is sympy.true:
            return True
    with contextlib.suppress(Exception):
        if relation_holds(expr, ranges):
            return True
    with contextlib.suppress(Exception):  # every size in ranges is 2 or more
        positive = expr.xreplace({s: sympy.Symbol(s.name, integer=True, positive=True) for s in expr.free_symbols})
        return min_max_decided(positive) is sympy.true or bool(sympy.simplify(positive) is sympy.true)
    return False


def relation_holds(expr: Any, ranges: Mapping[Any, Any]) -> bool:
    """Whether torch's bounds prove the relation ``expr`` once its sides are subtracted and
    factored, each remainder ``x % y`` with ``0 <= x < y`` taken as ``x``: the guards a map's
    or a signal's cells leave after floor divisions (``b*(L//10 - 1) != b``: ``b*(L//10 - 2)``
    is above 0 from ``L >= 30``; ``n % (n*m) != 0``: ``n``, above 0), which interval bounds of
    each side alone cannot settle."""
    import sympy
    from torch.utils._sympy.functions import Mod, PythonMod
    from torch.utils._sympy.value_ranges import bound_sympy

    def dividend(call: Any) -> Any:
        x, y = call.args
        below = bound_sympy(x, ranges).lower >= 0 and bound_sympy(sympy.factor(y - x), ranges).lower >= 1
        return x if below else call

    plain = expr.replace(lambda e: isinstance(e, (Mod, PythonMod, sympy.Mod)), dividend)
    if not isinstance(plain, sympy.core.relational.Relational):
        return plain is sympy.true  # sympy settled it (``n != 0`` for a size)
    bounds = bound_sympy(sympy.factor(plain.lhs - plain.rhs), ranges)
    low, high = bounds.lower, bounds.upper
    return {
        sympy.Ne: low > 0 or high < 0, sympy.Gt: low > 0, sympy.Ge: low >= 0, sympy.Lt: high < 0, sympy.Le: high <= 0,
    }.get(type(plain), False)  # fmt: skip


def min_max_decided(expr: Any) -> Any:
    """``expr`` with each ``Min`` (``Max``) replaced by the argument sympy's assumptions prove no
    greater (no less) than the others, where one is: ``Min(16*p + 16*s, 32*p + 32*s)`` is ``16*p +
    16*s`` for positive sizes. A tenth of the CPU ``sympy.simplify`` takes for such a guard."""
    import sympy

    def decided(call: Any) -> Any:
        sign = 1 if isinstance(call, sympy.Min) else -1
        for arg in call.args:
            if all(other is arg or (sign * (other - arg)).is_nonnegative for other in call.args):
                return arg
        return call

    return expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), decided)
