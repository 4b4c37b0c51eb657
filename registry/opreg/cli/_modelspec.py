"""``MODEL`` arguments of the command line: ``path/to/file.py:factory`` or
``package.module:factory``, where the factory returns ``(module, args)`` or
``(module, args, kwargs)``."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opreg.errors import OpregError


class ModelSpecError(OpregError):
    """A ``MODEL`` argument could not be loaded."""


@dataclasses.dataclass
class LoadedModel:
    module: Any
    args: tuple
    kwargs: dict[str, Any]
    spec: str


def load(spec: str) -> LoadedModel:
    """Import the factory named by ``spec`` and call it."""
    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not attr or not attr.isidentifier():
        raise ModelSpecError(
            f"MODEL {spec!r} must be 'path/to/file.py:factory' or 'package.module:factory', "
            "where factory() returns (module, args) or (module, args, kwargs)"
        )
    with _as_its_own_program(spec):
        if source.endswith(".py") or "/" in source or "\\" in source:
            namespace = _load_file(Path(source))
            factory = getattr(namespace, attr, None)
        else:
            try:
                factory = pkgutil.resolve_name(spec)
            except ImportError as e:
                raise ModelSpecError(f"cannot import module {source!r} for MODEL {spec!r}: {e}") from e
            except AttributeError:
                factory = None
            namespace = sys.modules.get(source)
    if factory is None:
        names = [n for n, v in vars(namespace or {}).items() if callable(v) and not n.startswith("_")]
        raise ModelSpecError(f"{source} has no {attr!r}; callables there: {', '.join(sorted(names)) or 'none'}")
    if not callable(factory):
        raise ModelSpecError(f"{source}:{attr} is a {type(factory).__name__}, not a factory function")
    with _as_its_own_program(spec):
        try:
            result = factory()
        except Exception as e:
            raise ModelSpecError(f"{spec}() raised {type(e).__name__}: {e}") from e
    return _unpack(result, spec)


@contextlib.contextmanager
def _as_its_own_program(spec: str) -> Iterator[None]:
    """Run the model's code with an ``sys.argv`` of its own (its argparse must not read
    opreg's arguments), and turn a ``sys.exit`` in it into an error instead of opreg's exit."""
    saved = sys.argv
    sys.argv = [spec.rpartition(":")[0]]
    try:
        yield
    except SystemExit as e:
        raise ModelSpecError(
            f"the code of MODEL {spec} called sys.exit({e.code!r}) while opreg loaded it: a factory must return "
            "(module, args); keep command-line handling under `if __name__ == '__main__':`"
        ) from e
    finally:
        sys.argv = saved


def _load_file(path: Path) -> Any:
    if path.is_dir():
        raise ModelSpecError(f"{path} is a directory; MODEL names a Python file in it: {path}/FILE.py:factory")
    if not path.is_file():
        raise ModelSpecError(f"model file {path} does not exist")
    resolved = path.resolve()
    name = f"_opreg_model_{hashlib.sha1(str(resolved).encode()).hexdigest()[:12]}"
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ModelSpecError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    sys.path.insert(0, str(resolved.parent))  # so the file can import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ModelSpecError(f"running {path} failed: {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(str(resolved.parent))
    return module


def _unpack(result: Any, spec: str) -> LoadedModel:
    import torch

    if not isinstance(result, tuple) or len(result) not in (2, 3):
        what = f"a tuple of {len(result)} items" if isinstance(result, tuple) else f"a {type(result).__name__}"
        raise ModelSpecError(f"{spec} returned {what}; it must return (module, args) or (module, args, kwargs)")
    module, args, *rest = result
    kwargs = rest[0] if rest else {}
    if not isinstance(module, torch.nn.Module):
        raise ModelSpecError(f"{spec} returned a {type(module).__name__} as the module; expected a torch.nn.Module")
    if not isinstance(args, tuple):
        args = (args,)
    if not isinstance(kwargs, dict):
        raise ModelSpecError(f"{spec} returned {type(kwargs).__name__} as kwargs; expected a dict")
    return LoadedModel(module, args, kwargs, spec)


def dynamic_shapes(loaded: LoadedModel, specs: list[str]) -> dict[str, Any] | None:
    """Build ``dynamic_shapes`` from ``--dynamic NAME:DIM=LABEL[,DIM=LABEL]`` items, or
    ``"auto"`` from ``--dynamic auto`` (every dim of every tensor input).

    ``NAME`` is a parameter of the module's ``forward``; the other parameters
    stay static.
    """
    if not specs:
        return None
    if "auto" in specs:
        if len(specs) > 1:
            raise ModelSpecError("--dynamic auto makes every dim dynamic: give it alone, not with other --dynamic")
        return "auto"
    import torch

    try:
        bound = inspect.signature(loaded.module.forward).bind(*loaded.args, **loaded.kwargs)
    except TypeError as e:
        raise ModelSpecError(f"the factory's inputs do not fit {type(loaded.module).__name__}.forward: {e}") from e
    names = list(bound.arguments)
    shapes: dict[str, Any] = {name: None for name in names}
    dims: dict[str, Any] = {}
    for item in specs:
        name, sep, body = item.partition(":")
        if not sep or not body:
            raise ModelSpecError(f"--dynamic {item!r}: write NAME:DIM=LABEL[,DIM=LABEL], e.g. x:0=batch,1=seq")
        if name not in shapes:
            raise ModelSpecError(
                f"--dynamic {item!r}: forward has no input {name!r}; its inputs are {', '.join(names)}"
            )
        value = bound.arguments[name]
        if not isinstance(value, torch.Tensor):
            raise ModelSpecError(f"--dynamic {item!r}: input {name!r} is a {type(value).__name__}, not a tensor")
        entry = shapes[name] or {}
        for part in body.split(","):
            index, _, label = part.partition("=")
            if not index.strip().lstrip("-").isdigit():
                raise ModelSpecError(f"--dynamic {item!r}: {part!r} needs a dim index, e.g. 0=batch")
            rank = value.dim()
            if not -rank <= int(index) < rank:
                raise ModelSpecError(
                    f"--dynamic {item!r}: input {name!r} has {rank} dim(s), so DIM is 0 to {rank - 1} "
                    f"(or -{rank} to -1), not {index}"
                )
            dim = int(index) % rank
            if dim in entry:
                raise ModelSpecError(f"--dynamic {item!r}: dim {dim} of input {name!r} is named twice")
            label = label.strip() or f"{name}_dim{dim}"
            if not label.isidentifier():
                raise ModelSpecError(f"--dynamic {item!r}: dim name {label!r} must be an identifier")
            if label not in dims:
                dims[label] = torch.export.Dim(label)
            entry[dim] = dims[label]
        shapes[name] = entry
    return shapes
