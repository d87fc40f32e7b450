"""Export (floor 3): a loaded model + a sparsity plan → a bundle (graphs, aligned weights, manifest).

Modules, one job each (see DESIGN.md beside this file):

- ``config``    :class:`ExportConfig`, the stage's one config
- ``spec``      what differs per architecture, read from the HF config (torch-free)
- ``weights``   aligned external-data files, each tensor written once (torch-free)
- ``graph``     a graph under construction: stable names, constants, fallbacks attached (torch-free)
- ``blocks``    RMSNorm, linear/MatMulNBits, RoPE, mask, GQA attention nodes (torch-free)
- ``mlp``       dense and DIP MLP nodes over the Flash-layout rows (torch-free)
- ``decoder``   the whole decoder with KV cache (torch-free)
- ``source``    the torch side: numpy weights layer by layer, quantised as read
- ``manifest``  the bundle's manifest dataclass and reader (torch-free; the runtime reads it)

Importing this package imports nothing heavy.
"""
