"""Every error opreg raises derives from :class:`OpregError`.

Messages say what went wrong, name the thing, and say what to do next.
"""

from __future__ import annotations


class OpregError(Exception):
    """Base class of every error opreg raises."""


class InvalidOpNameError(OpregError, ValueError):
    """A torch op name is not of the form ``namespace::name[.overload]``."""


class InvalidTargetError(OpregError, ValueError):
    """A target or target profile is malformed, unknown or out of range."""


class RegistrationError(OpregError):
    """An impl was refused at registration (bad metadata, lint failure)."""


class SignatureMismatchError(RegistrationError):
    """An impl's parameters do not match the torch op's schema."""


class FrozenRegistryError(OpregError):
    """A shared (built and cached) registry was asked to change."""


class PluginError(OpregError):
    """A pack failed to load or a hook raised, and strict mode is on."""


class PluginNotFoundError(PluginError, LookupError):
    """A pack was requested by name but no installed pack has that name."""


class NoImplementationError(OpregError, LookupError):
    """No registered impl can serve an op for a target."""
