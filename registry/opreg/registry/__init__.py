"""The registry as a value: torch op -> candidate impls, and resolution for a target.

One floor of opreg (docs/design.md, "Layers"): it imports only :mod:`opreg.errors`, the plain values
of :mod:`opreg.pluginapi` and :mod:`opreg.values`, and :mod:`opreg.node_types`; the pack loader
(:mod:`opreg.packs`), the exporter and the command line build on it and are never imported here.

- :mod:`.targets` (``Target``, ``VersionRange``, profiles, the supported opsets) and :mod:`.opname`
  (``namespace::name.overload``): the words;
- :mod:`.marks` (``@opreg.impl`` on a ``def``), :mod:`._inspect` and :mod:`._opsets` (reading an
  impl's code), :mod:`.impls` (``Impl``, a value, and ``build_impl``);
- :mod:`.registry` (``Registry``), :mod:`.explanation` (what ``explain`` and ``conflicts`` return);
- :mod:`.registrar` (what a pack's ``opreg_register_ops`` receives) and the registry's two doors to
  torch.onnx: :mod:`.table_in` (a ``custom_translation_table`` as impls, read by
  ``Registrar.register_translation_table``) and :mod:`.table_out` (``Registry.translation_table``).

Import the module that defines a name; this package's ``__init__`` imports nothing.
"""
