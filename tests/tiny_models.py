"""The tiny registry models tests are parametrised over, read from the registry (the shipped folder and
the test families' ``tests/families/``), so a new family's tiny model joins them unedited."""

from dipdeploy.registry import list_models

TINY = [m.name for m in list_models() if m.is_tiny]
#: those whose family the ONNX export builds (the record names no refusal)
EXPORTABLE = [m.name for m in list_models() if m.is_tiny and not m.arch.export_refusal]
