"""Diagnosis: an exported model run, verified against eager PyTorch, and located where it goes wrong.

:class:`opreg.exporter.OnnxProgram` holds the model, its names and ``save``; its ``run``, ``verify``
and ``locate`` forward here.
"""
