"""The registry as a pack sees it: what ``opreg_register_ops`` receives.

A pack marks each impl on its ``def`` with :func:`opreg.impl` (:mod:`opreg.registry.marks`)
and its hook hands the modules to :meth:`Registrar.register_module`.

A :class:`Registrar` collects one pack's impls. Each ``register`` call is
validated at once; an impl opreg refuses is recorded as a :class:`Rejection`
(and logged) instead of raised, so one bad impl does not cost the pack its
others. Nothing reaches a registry until the pack's hook has returned:
:func:`opreg.build_registry` then builds the registry from every pack's
registrar in one go.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import types
from collections.abc import Iterable, Mapping
from typing import Any

from opreg.errors import RegistrationError
from opreg.pluginapi import Rejection
from opreg.registry import table_in
from opreg.registry.marks import IMPL_ATTRIBUTE, ImplSpec, impl, marked, profile_names
from opreg.registry.opname import OpName
from opreg.registry.registry import Impl, Predicate, build_impl, impl_name
from opreg.registry.targets import VersionRange, VersionRangeLike, normalize_domain

logger = logging.getLogger(__name__)

__all__ = ["IMPL_ATTRIBUTE", "ImplSpec", "Known", "Registrar", "Rejection", "impl"]


class Known:
    """What one pack's impls were found to be when its code was last read, unchanged since
    (:mod:`opreg.packs.packcache` keeps it): a ``register`` call takes the next impl of its op and
    function name from here, with its requirement, kind, parameters, schema check and source,
    instead of reading the function again. Packs register in a fixed order, so the n-th call for
    an op and name gets the n-th impl; a call that declares anything else (opset, domains,
    priority, predicate, complex, profiles) gets nothing, and neither do the later ones of its
    op and name: they are read as usual."""

    def __init__(self, impls: Iterable[Impl]) -> None:
        self._queues: dict[tuple[OpName, str], collections.deque[Impl]] = {}
        for known in impls:
            self._queues.setdefault((known.op, known.name), collections.deque()).append(known)
        self.taken = 0
        """How many impls were taken from here."""

    def take(self, op: OpName, function: Any, arguments: Mapping[str, Any]) -> Impl | None:
        """The impl of ``function`` registered for ``op`` with ``arguments`` (``register``'s
        keywords), if it is the next one known for them; else ``None``."""
        key = (op, impl_name(function))
        queue = self._queues.get(key)
        if not queue:
            return None
        known = queue.popleft()
        if not _same_declaration(known, arguments):
            del self._queues[key]
            return None
        self.taken += 1
        return dataclasses.replace(known, function=function, predicate=arguments["predicate"])


def _same_declaration(known: Impl, arguments: Mapping[str, Any]) -> bool:
    """Whether ``arguments`` (``register``'s keywords) declare what ``known`` was registered with.
    An impl whose op had no torch schema then is read again if the op has one now (a pack's ops
    defined with ``torch.library`` when a model's module is imported), so that it is checked."""
    opset, domains = arguments["opset"], arguments["domains"]
    return (
        known.params is not None
        and (known.schema_checked or not _schema_defined(known.op))
        and not known.override
        and known.convention == "opreg"
        and known.priority == arguments["priority"]
        and known.complex == bool(arguments["complex"])
        and (known.predicate is not None) == (arguments["predicate"] is not None)
        and known.profiles == profile_names(arguments["profiles"], f"impl for {known.op}")
        and (opset is None or known.requirement.onnx == VersionRange.of(opset))
        and (
            domains is None
            or known.requirement.domains
            == tuple(sorted((normalize_domain(d), VersionRange.of(v)) for d, v in domains.items()))
        )
    )


def _schema_defined(op: OpName) -> bool:
    """Whether torch knows ``op``'s schema now (an op it cannot name is read again, to say why)."""
    from opreg.registry._inspect import torch_schema

    try:
        return torch_schema(op) is not None
    except RegistrationError:  # the full read reports it
        return True


class Registrar:
    """Collects one pack's impls and the ops it declares unsupported.

    Attributes:
        pack: the pack's name, stamped on every impl.
        impls: the impls accepted so far, in registration order.
        rejected: the impls refused, with why.
        declined: ops the pack deliberately leaves without an impl, with why.
    """

    def __init__(self, pack: str, known: Known | None = None) -> None:
        self.pack = pack
        self.known = known
        """What the pack's impls were last found to be, if its code is unchanged since (:class:`Known`)."""
        self.impls: list[Impl] = []
        self.rejected: list[Rejection] = []
        self.declined: dict[OpName, str] = {}

    def register(
        self,
        op: Any,
        function: Any,
        *,
        opset: VersionRangeLike | None = None,
        domains: Mapping[str, VersionRangeLike] | None = None,
        priority: int = 0,
        predicate: Predicate | None = None,
        complex: bool = False,
        profiles: Iterable[str] = (),
    ) -> Impl | None:
        """Register ``function`` for torch op ``op``.

        ``opset`` is the ai.onnx range (``18``, ``(18, 20)``); ``domains`` maps
        each custom domain the impl emits to its version; both default to what
        the function visibly uses. ``priority`` ranks impls of one op (higher
        wins; the core pack's are 0); ``predicate(node) -> bool`` limits the
        impl to the nodes it accepts; ``complex=True`` makes it the impl for nodes with
        complex values, carried as real tensors with a trailing dimension of 2
        (:mod:`opreg.values`), which no other impl sees; ``profiles=("onnxruntime",)`` keeps
        it for the targets that offer what one of those profiles names besides ai.onnx
        (:meth:`opreg.Registry.unmet`). Returns the impl, or ``None`` if it was
        rejected (the reason is in the pack's report, ``opreg plugins`` and
        the log).
        """
        arguments = {
            "opset": opset, "domains": domains, "priority": priority, "predicate": predicate,
            "complex": complex, "profiles": profiles,
        }  # fmt: skip
        try:
            impl = self.known.take(OpName.of(op), function, arguments) if self.known is not None else None
            if impl is None:
                impl = build_impl(op, function, pack=self.pack, override=False, **arguments)
        except Exception as e:  # a pack's mistake must not break the build
            self._reject(op, function, e)
            return None
        self.impls.append(impl)
        return impl

    def register_module(self, *modules: types.ModuleType) -> list[Impl]:
        """Register every function of ``modules`` marked with :func:`impl`, in definition order.

        Only functions defined in the module count (an impl imported from another
        module is registered with that module). Returns the impls accepted; the
        others are rejected and reported like any impl.
        """
        accepted: list[Impl] = []
        for function, spec in marked(*modules):
            done = self.register(spec.op, function, **spec.arguments())
            if done is not None:
                accepted.append(done)
        return accepted

    def register_translation_table(
        self, table: Any, *, opsets: table_in.OpsetsLike = None, priority: int = 0
    ) -> list[Impl]:
        """Register every function of a ``custom_translation_table`` (``{torch op: function}``
        as ``torch.onnx.export(dynamo=True)`` takes it; see :mod:`opreg.registry.table_in`).

        Each function's opset requirement is read from the function unless
        ``opsets`` declares it (``{"": 18, "com.microsoft": 1}``); ``priority``
        ranks them against other packs' impls. Returns the impls accepted; the
        others are rejected and reported like any impl. An op packet covers
        each overload whose schema the function fits (it is rejected only if
        it fits none).
        """
        accepted: list[Impl] = []
        packets: dict[str, tuple[Any, list[Exception], int]] = {}  # key -> (function, errors, accepted)
        for entry in table_in.entries(table):
            if entry.op is None:
                self._reject(entry.key, entry.function, RegistrationError(entry.error))
                continue
            try:
                impl = table_in.torch_impl(
                    entry.op, entry.function, opsets=opsets, priority=priority, pack=self.pack, override=False
                )
            except Exception as e:
                if not entry.from_packet:
                    self._reject(entry.op, entry.function, e)
                    continue
                impl = None
                error: list[Exception] = [e]
            else:
                accepted.append(impl)
                error = []
            if entry.from_packet:
                function, errors, count = packets.get(entry.key, (entry.function, [], 0))
                packets[entry.key] = (function, errors + error, count + (impl is not None))
        for key, (function, errors, count) in packets.items():
            if not count and errors:  # the function fits none of the packet's overloads
                self._reject(key, function, errors[0])
        self.impls.extend(accepted)
        return accepted

    def _reject(self, op: Any, function: Any, error: Exception) -> None:
        name = impl_name(function[0] if isinstance(function, (list, tuple)) and function else function)
        self.rejected.append(Rejection(str(op), name, f"{type(error).__name__}: {error}"))
        logger.warning("pack %r: impl %s for %s rejected: %s", self.pack, name, op, error)

    def mark_unsupported(self, op: Any, reason: str) -> None:
        """Declare that this pack deliberately has no impl for ``op``, and why
        (e.g. ONNX cannot express it); ``opreg check`` and export errors show the reason."""
        self.declined[OpName.of(op)] = str(reason)
