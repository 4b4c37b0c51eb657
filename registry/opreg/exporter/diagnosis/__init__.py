"""Diagnosis: an exported model run, verified against eager PyTorch, and located where it goes wrong.

:class:`opreg.exporter.OnnxProgram` holds the model, its names and ``save``; its ``run``, ``verify``
and ``locate`` forward here, one module each (:mod:`.run`, :mod:`.verify`, :mod:`.locate`). They share
:mod:`.compare` (the one comparison of a value with eager PyTorch's, which ``Decoder.verify`` and
``opreg.testing`` use too), :mod:`.eager` (the eager side) and :mod:`.report` (what ``locate`` returns).
"""
