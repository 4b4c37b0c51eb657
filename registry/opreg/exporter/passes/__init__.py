"""opreg's own graph passes, one room: every step of the finishing pipeline that is opreg's
(``opreg.exporter._finish.pipeline`` assembles them with onnx_ir's and onnxscript's passes and
the packs' rewrites).

- :mod:`~opreg.exporter.passes.pipeline`: :class:`Pipeline` (passes that say what they run),
  :class:`IfModified`, :class:`Rules` (onnxscript rules tried only on their root op), graph walks;
- :mod:`~opreg.exporter.passes.lean`: the lean pass, its exact rewrite rules (``RULES``), constant
  and batch-norm folding, weights stored transposed;
- :mod:`~opreg.exporter.passes.outputs`: the outputs' names, bound to them, subgraphs' outputs owned;
- :mod:`~opreg.exporter.passes.seeding`: random nodes seeded;
- :mod:`~opreg.exporter.passes.precision`: ``keep_float32``, bfloat16 nodes without a CPU kernel in float32;
- :mod:`~opreg.exporter.passes.housekeeping`: authoring attributes stripped, the lowest IR version.

A new framework pass is an ``onnx_ir`` pass in the module of its concern here (a new module for a
new concern), added to the pipeline in ``_finish.pipeline``; an exact rewrite rule goes to
``lean.RULES``; a rule for one runtime or domain belongs to a pack (``opreg_rewrite_rules``).
Nothing is imported here: each module is imported by name.
"""
