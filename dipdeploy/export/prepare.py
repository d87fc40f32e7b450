"""The steps before graphs: merge a LoRA adapter, and find or make the sparsity plan (torch side).

Order matters, so that the plan and the quantiser see the weights the bundle runs: the adapter is merged
into the fp32 base weights first (``W + AB`` costs nothing at run time, docs/method.md), the plan is
calibrated on those weights, and only then are weights quantised (``source``).
"""

from __future__ import annotations

import json
from pathlib import Path

from dipdeploy.export.config import EXPORT_METHODS, ExportConfig
from dipdeploy.torchdevice import resolve_device
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan, uniform_plan


def merge_lora(lm, adapter: str | Path) -> dict:
    """Merge a peft adapter into ``lm.model`` in place (``merge_and_unload``); returns what was merged.

    Refuses an adapter whose target modules or shapes do not fit this model, with a clear error.
    """
    adapter = Path(adapter)
    cfg_path = adapter / "adapter_config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{adapter} is not a peft adapter directory (no adapter_config.json)")
    acfg = json.loads(cfg_path.read_text())
    from peft import PeftModel

    try:
        peft_model = PeftModel.from_pretrained(lm.model, str(adapter))
    except (RuntimeError, ValueError, KeyError) as err:
        raise ValueError(
            f"LoRA adapter {adapter} does not fit model {lm.name!r} (made for "
            f"{acfg.get('base_model_name_or_path')!r}?): {str(err).splitlines()[0][:300]}"
        ) from err
    lm.model = peft_model.merge_and_unload()
    lm.model.eval()
    return {"path": str(adapter), "base_model": acfg.get("base_model_name_or_path"), "r": acfg.get("r"),
            "target_modules": acfg.get("target_modules")}


#: peft options a weight-by-weight merge (W + (α/r)·B·A per Linear) does not express.
_STREAM_UNSUPPORTED = ("use_dora", "lora_bias", "modules_to_save", "rank_pattern", "alpha_pattern", "fan_in_fan_out")


def stream_lora(lm, adapter: str | Path) -> dict:
    """Merge a peft adapter into a streamed model (``lm.checkpoint``) as each weight is read: the
    adapter's A and B (small: r · (d + F) numbers per projection) are loaded now, and
    ``StreamedCheckpoint`` adds (B·A)·scaling to a weight when its layer is read, the arithmetic of
    peft's ``merge_and_unload`` in fp32 (docs/method.md, "LoRA recovery"), so the merged weights, hence
    the calibrated plan and the bundle, are the eager export's. Refuses what that sum cannot express
    (DoRA, LoRA biases, embeddings, ``modules_to_save``, per-module rank or alpha patterns) and an
    adapter whose modules or shapes do not fit the model."""
    import math

    import torch
    from safetensors.torch import load_file

    adapter = Path(adapter)
    cfg_path, weights = adapter / "adapter_config.json", adapter / "adapter_model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{adapter} is not a peft adapter directory (needs adapter_config.json and "
                                f"adapter_model.safetensors)")
    acfg = json.loads(cfg_path.read_text())
    used = [k for k in _STREAM_UNSUPPORTED if acfg.get(k)]
    if used:
        raise ValueError(f"LoRA adapter {adapter} uses {', '.join(used)}, which a streamed export cannot merge "
                         f"weight by weight; export with --no-stream on a machine that holds the model")
    r, alpha = int(acfg["r"]), float(acfg["lora_alpha"])
    scaling = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r  # peft's LoraLayer.update_layer
    tensors = load_file(str(weights))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        module, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        if part not in ("A.weight", "B.weight"):
            raise ValueError(f"LoRA adapter {adapter}: tensor {key!r} is not a Linear layer's lora_A/lora_B; a "
                             f"streamed export merges Linear adapters only (export with --no-stream)")
        pairs.setdefault(module, {})[part[0]] = value.to(torch.float32)
    merges = {}
    for module, ab in sorted(pairs.items()):
        name = f"{module}.weight"
        try:
            target = lm.model.get_submodule(module).weight
        except AttributeError:
            target = None
        a, b = ab.get("A"), ab.get("B")
        if target is None or not lm.checkpoint.has(name) or a is None or b is None \
                or tuple(target.shape) != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
            raise ValueError(f"LoRA adapter {adapter} does not fit model {lm.name!r} (made for "
                             f"{acfg.get('base_model_name_or_path')!r}?): {module} is missing or has another shape")
        merges[name] = (a, b, scaling)
    lm.checkpoint.lora = merges
    return {"path": str(adapter), "base_model": acfg.get("base_model_name_or_path"), "r": acfg.get("r"),
            "target_modules": acfg.get("target_modules")}


def load_plan(path: str | Path, lm) -> SparsityPlan:
    plan = SparsityPlan.load(Path(path))
    c = lm.model.config
    plan.check_model(c.num_hidden_layers, c.hidden_size, c.intermediate_size)
    if plan.method not in EXPORT_METHODS:
        raise ValueError(f"plan method {plan.method!r} cannot be exported; exportable: {', '.join(EXPORT_METHODS)}")
    from dipdeploy.sparsity.scores import FOLDED

    if plan.score in FOLDED and lm.arch.norms.mlp_in is None:  # the fold scales the MLP's input norm
        raise ValueError(f"score {plan.score!r} is folded into the MLP's input norm, which {lm.arch.name} does not "
                         f"have; calibrate the plan with --score abs or --score wina")
    return plan


def make_plan(lm, cfg: ExportConfig, progress=None) -> SparsityPlan | None:
    """The plan ``model.onnx`` runs: from ``cfg.plan``, else uniform at ``rho_in``, else calibrated
    (``progress`` counts the calibration's passes: ``dipdeploy.sparsity.calibrate``)."""
    if cfg.plan is not None:
        plan = load_plan(cfg.plan, lm)
        if plan.method != cfg.method and cfg.method != "dip":
            raise ValueError(f"--method {cfg.method} disagrees with the plan's method {plan.method!r}")
        return plan
    if cfg.method == "dense":
        return None
    c = lm.model.config
    scfg = SparsityConfig(method=cfg.method, density=cfg.density, rho_in=cfg.rho_in, gamma=cfg.gamma)
    if cfg.rho_in is not None:
        return uniform_plan(scfg, lm.name, c.num_hidden_layers, c.hidden_size, c.intermediate_size)
    from dipdeploy.sparsity.calibrate import calibrate_on

    from dipdeploy.data import calibration_windows

    try:
        wins = calibration_windows(lm.tokenizer, cfg.calib_windows, cfg.calib_seqlen, cfg.data_dir)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err}; or skip calibration with --rho-in R or --plan PLAN") from err
    # a streamed model one layer in memory at a time, the same plan (sparsity/streamed.py)
    return calibrate_on(lm, scfg, wins, resolve_device(cfg.device), progress)


def miss_trace(lm, plan: SparsityPlan, wins) -> list[tuple]:
    """Per layer, the (up|gate, down) miss matrices [T, R] of the calibration windows: the rows each token
    selects under ``plan`` (DIP-CA with its own cache, as the torch reference decodes) that a cache of the
    plan's capacities (``cache_frac`` shared by ``cache_split``) and ``policy`` did not hold before the
    token, every window starting cold. The row order is built from them (docs/method.md, "Flash layout")."""
    import numpy as np
    import torch

    from dipdeploy.cache import RowCache
    from dipdeploy.flash import miss_cost
    from dipdeploy.quant.roworder import miss_matrix
    from dipdeploy.sparsity.methods import reset_caches, sparse_mlps, sparsify_, unsparsify_

    sizes = (plan.hidden_size, plan.intermediate_size)
    misses: list[tuple[list, list]] = [([], []) for _ in plan.layers]
    capacity = plan.cache_capacity(miss_cost)

    def keep(i: int, arrays: dict) -> None:
        for g, key in enumerate(("sel_in", "sel_glu")):
            sel = arrays[key]
            sel = (sel.detach().cpu().numpy() if torch.is_tensor(sel) else np.asarray(sel))[0]
            cache = RowCache(sizes[g], capacity[i][g], plan.policy)
            for row in sel:
                misses[i][g].append(row[~cache.access(row[None])[0]])

    sparsify_(lm.model, plan)
    try:
        for mlp in sparse_mlps(lm.model):
            mlp.recorder = keep
        with torch.no_grad():
            for w in wins:
                reset_caches(lm.model)
                lm.model(w[None], use_cache=False)
    finally:
        unsparsify_(lm.model)
    return [tuple(miss_matrix(m, n) for m, n in zip(layer, sizes)) for layer in misses]
