"""Op packs: finding, loading and isolating them, their hooks, and the host that calls them.

One floor of opreg (docs/design.md, "Layers"), above :mod:`opreg.registry`, which it builds: nothing
here is imported by the registry.

- :mod:`.hookspecs` (the plugin API: the hooks a pack may implement, each carrying its contract) and
  :mod:`.hookchecks` (the contracts: when a hook is called, how its result is checked);
- :mod:`.discovery` (entry points of group ``opreg.plugins``, a selection), :mod:`.isolation` (one
  pack loaded on its own), :mod:`.packcache` (what the installed packs declare, cached),
  :mod:`.plugins` (the build: a frozen registry and the host beside it);
- :mod:`.packset` (every pack's report and hooks) and :mod:`.host` (``PackHost``, what an export asks
  of the packs' code);
- :mod:`.patching` (capture patches around ``torch.export``) and :mod:`.packfaults` (what a pack got
  wrong in one export, shown wherever a user looks).

Import the module that defines a name; this package's ``__init__`` imports nothing.
"""
