"""The bundle format (floor 1, torch-free): what an export writes and every reader opens.

A bundle is a directory::

    manifest.json        format, version, source model, method, plan, quant, tensors, files (``manifest.py``)
    model.onnx           the whole decoder with KV cache (I/O names of onnxruntime-genai)
    embed.onnx, positions.onnx, layer.{i}.attn/mlp_up/mlp_down.onnx, head.onnx   per-layer graphs for the
                         host runtime
    dense.bin, mlp.bin   weights as ONNX external data, every tensor aligned (4 KiB by default);
                         mlp.bin holds the MLP in the Flash layout (see ``tensors[*].layout``)
    genai_config.json, tokenizer files

``names.py``: the names writer and readers agree on (files, graphs, symbolic dims, tensors);
``manifest.py``: the manifest, its format and version, and the one reader that checks a bundle before
anything in it is opened; ``bundledir.py``: the bundle folder held by one descriptor, through which
every file is opened, checked on that descriptor and read; ``graphdata.py``: the external-data files each graph names, read without
``onnx``, which that reader holds to the manifest's files. Written by ``dipdeploy.export``; read by ``dipdeploy.runtime``, the CLI and the
Android demo's Java mirror (``android_demo/engine/.../Manifest.java``).
"""
