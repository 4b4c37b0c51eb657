"""Writing a new op pack: ``opreg new-pack NAME --op SCHEMA``.

:mod:`.scaffold` chooses the pack's names and where it is written; :mod:`._opspec` reads the ``--op``
schemas; :mod:`._packcode` writes the package (hooks, impls, schemas, kernels, samples) and
:mod:`._packfiles` the rest (metadata, README, CI, test), both through :mod:`._packtext`'s templates.
``well_known_names.txt`` lists the names a new pack may not take.

Import the module that defines a name; this package's ``__init__`` imports nothing.
"""
