"""torch.onnx's vocabulary over opreg: the tutorials' API (:mod:`.compat`: ``OnnxRegistry``,
``ExportOptions``, ``dynamo_export``, ``pack_from_translation_table``).

The registry's own doors to torch.onnx live with the registry, which uses them:
:mod:`opreg.registry.table_in` (a ``custom_translation_table`` as impls) and
:mod:`opreg.registry.table_out` (the registry as one).

Import the module that defines a name; this package's ``__init__`` imports nothing.
"""
