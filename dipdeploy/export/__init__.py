"""Export (floor 4): a loaded model + a sparsity plan → a bundle (graphs, aligned weights, manifest).

Modules, one job each (see DESIGN.md beside this file):

- ``config``    :class:`ExportConfig`, the stage's one config
- ``spec``      what differs per architecture, read from the HF config (torch-free)
- ``weights``   aligned external-data files, each tensor written once (torch-free)
- ``graph``     a graph under construction: stable names, constants, fallbacks attached (torch-free)
- ``blocks``    RMSNorm, linear/MatMulNBits, RoPE, mask, GQA attention nodes (torch-free)
- ``mlp``       the MLP's tensors, GLU and dense MLP over the Flash-layout rows (torch-free)
- ``layer``     one decoder layer as its three segments, and the head, for both graph kinds (torch-free)
- ``decoder``   the whole decoder with KV cache (torch-free)
- ``source``    the torch side: numpy weights layer by layer, quantised as read
- ``layers``    per-layer graphs for the host runtime (torch-free)
- ``prepare``   LoRA merge and the plan (given, uniform or calibrated)
- ``validate``  greedy decoding, ORT (stock and native) against the torch reference
- ``bundle``    ``export``/``export_model``: the stage, atomic output, manifest (the format, its reader and
                verify: ``dipdeploy.bundle``, floor 1)
- ``generate``  greedy text from a bundle with plain ORT (torch-free)

Importing this package imports nothing heavy.
"""
