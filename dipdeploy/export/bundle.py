"""``export``: a loaded model + an :class:`ExportConfig` → a bundle directory, validated.

Safety (``dipdeploy.export.outdir``, ``dipdeploy.dirswap``): ``out`` is locked for the whole export;
everything is built in a temporary sibling (``.<name>.tmp-*``) and swapped in at the end (one
``RENAME_EXCHANGE`` or two renames), the old bundle removed only after the new one is in place; an existing ``out`` is refused
without ``force``; any error or Ctrl-C removes the temporary directory, and what SIGKILL leaves is
repaired by the next export, so ``out`` never holds a half bundle and a bundle is never lost.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from dipdeploy.bundle.manifest import Manifest, check_structure, file_record
from dipdeploy.bundle.names import MANIFEST
from dipdeploy.dirswap import Hook
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.decoder import LayerK, build_decoder
from dipdeploy.export.graph import check_model
from dipdeploy.export.outdir import Notice, claim, is_bundle, prepare_out
from dipdeploy.export.space import check_space_for
from dipdeploy.export.weights import WeightStore
from dipdeploy.paths import atomic_dir
from dipdeploy.ops.schemas import DOMAIN, OPSET_VERSION
from dipdeploy.sparsity.plan import SparsityPlan

MODEL_FILE = "model.onnx"
ORT_MIN = "1.29"
#: announces each step by name; it may return the step's counter (``dipdeploy.progress.Stage``), which the
#: steps that count their work (calibrate, validate) report to
Progress = Callable[[str], object]


class ValidationError(RuntimeError):
    """ORT and the torch reference disagree beyond the stated tolerance."""


@dataclass
class ExportResult:
    out: Path
    manifest: Manifest
    seconds: float
    steps: dict = field(default_factory=dict)

    def summary(self) -> dict:
        m = self.manifest
        return {"out": str(self.out), "model": m.source["model"], "method": m.method,
                "density": (m.plan or {}).get("density", 1.0), "quant": (m.quant or {}).get("name", "none"),
                "attention": m.export_config.get("attention"),
                **m.sizes, **{k: m.validation.get(k) for k in (
                    "agrees_stock", "agrees_native", "near_ties_stock", "near_ties_native", "max_abs_diff",
                    "max_abs_diff_native", "max_abs_diff_free_stock", "tolerance", "level4")},
                "validation_skipped": m.validation.get("skipped"),
                "bits_per_weight_mlp": (m.quant or {}).get("bits_per_weight_mlp", 32.0),
                "bits_per_weight_dense": (m.quant or {}).get("bits_per_weight_dense", 32.0),
                "seconds": round(self.seconds, 2), "steps_s": self.steps}


def layer_ks(plan: SparsityPlan | None, num_layers: int) -> list[LayerK]:
    if plan is None:
        return [LayerK(None, None)] * num_layers
    if plan.method == "dense":
        return [LayerK(None, None)] * num_layers
    return [LayerK(lp.k_in, lp.k_glu) for lp in plan.layers]


def reference_plan(plan: SparsityPlan | None) -> SparsityPlan | None:
    """The torch plan that matches ``model.onnx``: DIP-CA runs as plain DIP with the same K; a folded score
    (``sparsity.scores.FOLDED``) as plain |·| on the folded weights the export leaves in the model."""
    from dipdeploy.sparsity.scores import FOLDED

    if plan is None or (plan.method != "dip-ca" and plan.score not in FOLDED):
        return plan
    ref = copy.deepcopy(plan)
    if plan.method == "dip-ca":
        ref.method, ref.gamma = "dip", 1.0
    if plan.score in FOLDED:
        ref.score = "abs"
    return ref


def _genai_config(spec, tokenizer, max_length: int, lib_name: str | None) -> dict:
    so: dict = {"log_id": "onnxruntime-genai", "provider_options": []}
    if lib_name:
        so["custom_ops_library"] = lib_name
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    return {"model": {
        "bos_token_id": tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos,
        "context_length": max_length, "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        "type": spec.arch.genai_type, "vocab_size": spec.vocab_size,
        "decoder": {"session_options": so, "filename": MODEL_FILE, "head_size": spec.head_dim,
                    "hidden_size": spec.hidden_size, "num_attention_heads": spec.num_heads,
                    "num_hidden_layers": spec.num_layers, "num_key_value_heads": spec.num_kv_heads,
                    "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                               "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                               "past_value_names": "past_key_values.%d.value"},
                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "max_length": max_length, "num_beams": 1, "top_k": 1}}


def export(lm, cfg: ExportConfig, out: Path, plan: SparsityPlan | None, *, force: bool = False,
           progress: Progress = lambda step: None, extra: dict | None = None,
           notice: Notice = lambda line: None, swap_hook: Hook | None = None) -> ExportResult:
    """Quantise (as asked), build the graphs, write the bundle, validate; ``lm`` is modified in place
    (fake-quantised, sparsified) so it is the torch reference of the bundle. ``notice`` receives one
    line per repair of what a killed export left; ``swap_hook`` is
    :func:`dipdeploy.dirswap.replace_dir`'s."""
    out = Path(out)
    t0, steps = time.perf_counter(), _Steps(progress)
    with claim(out, notice):
        prepare_out(out, force)
        with atomic_dir(out, wait=False, complete=is_bundle, hook=swap_hook) as tmp:
            try:
                manifest = _build(lm, cfg, tmp, plan, steps, extra or {})
            except OSError as err:
                raise BundleWriteError(err.errno, f"writing the bundle failed: {err.strerror or err} "
                                       f"({err.filename or tmp}); {out} is unchanged") from err
            steps("swap into place")
        steps()
    return ExportResult(out, manifest, time.perf_counter() - t0, steps.seconds)


class BundleWriteError(OSError):
    """The disk refused a write (full, read-only, quota); the previous bundle is kept."""

    def __str__(self) -> str:
        return self.strerror


class _Steps:
    """Times named steps and announces each start to ``progress``."""

    def __init__(self, progress: Progress):
        self.progress, self.seconds = progress, {}
        self._name, self._t = None, 0.0

    def __call__(self, name: str | None = None):
        """The step's counter, where ``progress`` returns one (None otherwise)."""
        now = time.perf_counter()
        if self._name:
            self.seconds[self._name] = round(now - self._t, 3)
        self._name, self._t = name, now
        return self.progress(name) if name else None


def _build(lm, cfg: ExportConfig, tmp: Path, plan, steps: _Steps, extra: dict) -> Manifest:
    from dipdeploy.export.source import ModelSource
    from dipdeploy.ops.native import library_path
    from dipdeploy.sparsity.scores import FOLDED

    fitted = cfg.mlp_config()
    if plan is not None and plan.score in FOLDED and fitted is not None and fitted.statistics() is not None:
        raise ValueError(f"score {plan.score} is folded into the MLP weights, but a calibrated vq3's statistics are "
                         f"the unfolded model's; use --score abs, or fit plain k-means with --vq-hessian none")
    missed, row_order = _row_order(lm, cfg, plan, steps)
    mlp_cfg, calib, fit = _quant_statistics(lm, cfg, steps)
    steps("quantise + build graphs")
    source = ModelSource(lm, mlp_cfg, wina=plan is not None and plan.score == "wina", max_length=cfg.max_length,
                         embedding=cfg.embedding, calib=calib, fold=FOLDED.get(plan.score) if plan is not None else None,
                         dense_bits=_dense_bits(lm, cfg))
    store = WeightStore(tmp, cfg.alignment)
    graphs, orders = _write_graphs(source, store, plan, cfg, tmp, steps, missed)
    if orders:
        row_order = {**row_order, **_order_summary(orders)}
    if graphs.get("layers") and row_order.get("order", "natural") == "natural":
        from dipdeploy.export.joined import write_joined

        steps("join the per-layer graphs")  # the joined decoder: every host's default path below 100 %
        graphs["decoder"] = write_joined(tmp, source.spec.num_layers, cfg.attention == "standard")
    lm.tokenizer.save_pretrained(tmp)
    lib = library_path()
    if lib is not None:  # for onnxruntime-genai (genai_config.json); docs/design.md, "The op library in a bundle"
        shutil.copy2(lib, tmp / lib.name)
    (tmp / "genai_config.json").write_text(json.dumps(
        _genai_config(source.spec, lm.tokenizer, source.max_length, lib.name if lib else None), indent=1))
    validation: dict = {}
    if cfg.validate_tokens > 0:
        counter = steps("validate")
        validation = _validate(lm, cfg, plan, source.spec, tmp, counter)
    elif lm.checkpoint is not None:
        validation = {"skipped": "streamed export (weights read one layer at a time): the torch reference "
                                 "needs the whole model; check with `dipdeploy inspect BUNDLE --prompt TEXT`"}
    steps("manifest")
    manifest = _manifest(lm, cfg, plan, source, store, graphs, validation, tmp, extra, lib, row_order, fit)
    (tmp / MANIFEST).write_text(manifest.to_json())
    check_structure(tmp, manifest, "none")  # what every reader will check: fail here, not on the user's machine
    return manifest


def _quant_statistics(lm, cfg: ExportConfig, steps: _Steps) -> tuple:
    """(MLP quant config, its per-layer calibration statistics or None, the manifest's record of the fit).

    A calibrated format (vq3 by default) takes its statistics from the fp32 (LoRA-merged) model on the
    calibration text every command uses, before any weight is quantised, the computation of ``eval
    --quant`` and ``dipdeploy quantize`` (``quant.fake.calibration_statistics``), so the bundle holds
    the numbers they measure."""
    from dipdeploy.quant.fake import calibration_statistics, fit_record

    mlp_cfg = cfg.mlp_config()
    if mlp_cfg is None:
        return None, None, None
    ids = None
    if mlp_cfg.statistics() is not None:
        from dipdeploy.data import calibration_windows

        steps("quantisation statistics")
        try:
            ids = calibration_windows(lm.tokenizer, cfg.stats_windows, cfg.calib_seqlen, cfg.data_dir)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err}; or fit plain k-means with --vq-hessian none") from err
    from dipdeploy.sparsity.methods import uniform_dip

    return mlp_cfg, calibration_statistics(lm.model, mlp_cfg, ids, under_dip=uniform_dip), fit_record(mlp_cfg, ids)


def _dense_bits(lm, cfg: ExportConfig):
    """``--dense-bits`` with, for ``auto`` on a quantised export, the source GGUF's tensor types."""
    from dipdeploy.loading import source_types
    from dipdeploy.quant.dense import DenseBits

    auto = cfg.dense_bits == "auto" and cfg.quantised
    return DenseBits(cfg.dense_bits, source_types(lm) if auto else {})


def dense_format(by_bits: dict) -> str:
    """The manifest's words for the attention and lm_head weights, from their bits (``quant.dense``)."""
    bits = sorted(int(b) for b, n in by_bits.items() if n) or [4]
    return "com.microsoft::MatMulNBits " + " and ".join(f"int{b}" for b in bits)


def _row_order(lm, cfg: ExportConfig, plan, steps: _Steps) -> tuple[list | None, dict]:
    """The calibration miss matrices of every layer (None: natural order) and the manifest's
    ``row_order`` record; ``auto`` falls back to natural, saying why, where ``calibrated`` is refused."""
    if cfg.row_order == "natural":
        return None, {"order": "natural"}
    why = None
    if plan is None or plan.method == "dense" or not cfg.per_layer:
        why = "no per-layer graphs: the host runtime streams only sparse bundles"
    elif lm.checkpoint is not None:
        why = "a streamed export has no whole model to trace the calibration text with"
    wins = None
    if why is None:
        from dipdeploy.data import calibration_windows

        try:
            wins = calibration_windows(lm.tokenizer, cfg.calib_windows, cfg.calib_seqlen, cfg.data_dir)
        except FileNotFoundError as err:
            why = f"no calibration text ({err})"
    if why is not None:
        if cfg.row_order == "calibrated":
            raise ValueError(f"--row-order calibrated: {why}; pass --row-order natural")
        return None, {"order": "natural", "why": why}
    from dipdeploy.export.prepare import miss_trace
    from dipdeploy.flash import BLOCK

    steps("row order")
    missed = miss_trace(lm, plan, wins)
    return missed, {"order": "calibrated", "policy": plan.policy, "cache_frac": plan.cache_frac,
                    "tokens": int(wins.numel()), "block": BLOCK}


def _order_summary(orders: list[dict]) -> dict:
    """What the calibrated order bought on its own trace: blocks touched, natural vs kept, and how many
    groups kept each candidate ordering."""
    kept: dict[str, int] = {}
    natural = calibrated = 0
    for layer in orders:
        for o in layer.values():
            kept[o.ordering] = kept.get(o.ordering, 0) + 1
            natural += o.blocks["natural"]
            calibrated += o.blocks[o.ordering]
    return {"kept": kept, "blocks_natural": natural, "blocks_calibrated": calibrated,
            "candidates": {name: sum(o.blocks[name] for layer in orders for o in layer.values())
                           for name in next(iter(orders[0].values())).blocks}}


def _write_graphs(source, store: WeightStore, plan, cfg: ExportConfig, tmp: Path, steps: _Steps,
                  missed: list | None = None) -> tuple[dict, list[dict]]:
    """model.onnx (+ the per-layer graphs of a sparse plan), weights streamed to the store; all checked.
    Also returns each layer's calibrated group orders (group → ``GroupOrder``; empty in the natural order)."""
    spec = source.spec
    per_layer = None
    if cfg.per_layer and plan is not None:
        from dipdeploy.export.layers import LayerGraphs

        per_layer = LayerGraphs(spec, store, plan, cfg.accuracy_level, tmp, source.rope(), cfg.attention,
                                cfg.fuse_norms)
    graphs: dict = {"model": MODEL_FILE}
    orders: list[dict] = []

    def on_layer(i: int, lw, t) -> None:
        if t.orders:
            orders.append(t.orders)
        if per_layer is not None:
            per_layer.add_layer(i, lw, t)

    try:
        model = build_decoder(source, store, layer_ks(plan, spec.num_layers), cfg.accuracy_level,
                              on_layer=on_layer, attention_op=cfg.attention, fuse_norms=cfg.fuse_norms,
                              missed=missed)
        steps("write bundle")
        onnx.save_model(model, str(tmp / MODEL_FILE))
        del model
        if per_layer is not None:
            graphs["layers"] = per_layer.finish(source)
    finally:
        store.close()
    for name in [MODEL_FILE, *graphs.get("layers", [])]:
        check_model(tmp / name)
    return graphs, orders


def _validate(lm, cfg: ExportConfig, plan, spec, tmp: Path, progress=None) -> dict:
    from dipdeploy.export.validate import validate
    from dipdeploy.sparsity.methods import sparsify_

    ref = reference_plan(plan)
    if ref is not None:
        sparsify_(lm.model, ref)
    prompt = np.asarray(lm.tokenizer(cfg.prompt, add_special_tokens=False).input_ids, dtype=np.int64)
    path, level4 = tmp / MODEL_FILE, None
    if cfg.quantised and cfg.accuracy_level > 0:
        # torch has no int8 activations: hold the level-0 twin (same graph, same weight files) to the
        # reference, and measure the level-4 graph against it.
        import onnx

        from dipdeploy.ops.nodes import with_accuracy_level

        path, level4 = tmp / "model.level0.onnx", tmp / MODEL_FILE
        onnx.save(with_accuracy_level(onnx.load(str(level4), load_external_data=False), 0), str(path))
    try:
        sparse = plan is not None and plan.method != "dense"
        v = validate(path, lm.model, spec, prompt, cfg.validate_tokens, sparse=sparse, quantised=cfg.quantised,
                     threads=cfg.threads, level4_path=level4, progress=progress)
    finally:
        if level4 is not None:
            path.unlink(missing_ok=True)
    if not v.ok:
        raise ValidationError("bundle disagrees with the torch reference: " + v.describe())
    return v.as_dict()


def _manifest(lm, cfg, plan, source, store, graphs, validation, tmp: Path, extra: dict, lib,
              row_order: dict, fit: dict | None) -> Manifest:
    import onnxruntime as ort

    files = {p.relative_to(tmp).as_posix(): file_record(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    st, quant = source.stats, None
    if source.mlp_cfg is not None:
        quant = {"name": cfg.quant, **source.quant_dict(), "fit": fit,
                 "bits_per_weight_mlp": st.mlp_bits / st.mlp_params,
                 "bits_per_weight_dense": st.dense_bits / max(1, st.dense_params),
                 "bits_per_weight": (st.mlp_bits + st.dense_bits) / (st.mlp_params + st.dense_params),
                 "attention_and_lm_head": dense_format(st.dense_by_bits),
                 "embedding": "com.microsoft::GatherBlockQuantized int4" if source.int4_embedding else "fp32"}
    sizes = {"bytes_total": sum(f["size"] for f in files.values()),
             **{f"bytes_{Path(n).stem}": f["size"] for n, f in files.items() if n.endswith(".bin")}}
    dipca = None
    if plan is not None and plan.method == "dip-ca":
        dipca = {"in_model_onnx": "plain DIP with the plan's K (gamma ignored)",
                 "host_runtime": "layer.{i}.attn/mlp_up.onnx take each group's cache residency and apply gamma",
                 "gamma": plan.gamma, "policy": plan.policy, "cache_frac": plan.cache_frac,
                 "fixed_top_n": plan.fixed_top_n, "gamma_warmup": plan.gamma_warmup}
    spec = source.spec
    note = {"tokenizer_note": spec.arch.tokenizer_note} if spec.arch.tokenizer_note else {}
    return Manifest(
        source={"model": lm.name, "architecture": spec.architecture, "config": lm.model.config.to_dict(), **note,
                **extra},
        method=plan.method if plan is not None else "dense",
        plan=json.loads(plan.to_json()) if plan is not None else None, quant=quant,
        ops={"domain": DOMAIN, "version": OPSET_VERSION, "native_library": lib.name if lib else None},
        onnxruntime={"min": ORT_MIN, "exported_with": ort.__version__}, graphs=graphs,
        tensors={n: e.as_dict() for n, e in store.entries.items()}, files=files, dipca=dipca, sizes=sizes,
        validation=validation, export_config=cfg.as_dict(), alignment=cfg.alignment, row_order=row_order,
    )


def _should_stream(cfg: ExportConfig) -> bool:
    """cfg.stream, or (None) whether the fp32 model exceeds half of the available memory."""
    from dipdeploy.loading import streams_by_default

    stream = streams_by_default(cfg.model) if cfg.stream is None else cfg.stream
    if stream and cfg.row_order == "calibrated":
        raise ValueError("a streamed export cannot calibrate the row order (it traces the whole model): "
                         "pass --row-order natural, or export without --stream on a machine that holds it")
    mlp_cfg = cfg.mlp_config()
    if stream and mlp_cfg is not None and mlp_cfg.statistics() is not None:
        raise ValueError(f"a streamed export cannot calibrate --quant {cfg.quant} (its statistics come from a "
                         "forward pass of the whole model): pass --vq-hessian none (plain k-means), or export "
                         "without --stream on a machine that holds the model"
                         + ("" if cfg.stream else " (streaming was chosen because the fp32 model exceeds half "
                            "of the free memory)"))
    return stream


def export_model(cfg: ExportConfig, out: Path, *, force: bool = False, progress: Progress = lambda step: None,
                 notice: Notice = lambda line: None, swap_hook: Hook | None = None) -> ExportResult:
    """The whole stage: load → merge LoRA → plan (given, uniform or calibrated) → :func:`export`.

    ``out`` is claimed (locked, checked, free space estimated) before minutes of work, and stays
    claimed until the bundle is in place, so a second export to it cannot start meanwhile."""
    from dipdeploy.export.spec import ArchSpec
    from dipdeploy.loading import model_config
    from dipdeploy.torchdevice import resolve_device

    # a family, or a context, the graphs cannot build, or a device torch does not see: refused before any work
    ArchSpec.from_config(model_config(cfg.model)).check_export(cfg.max_length, cfg.attention)
    resolve_device(cfg.device)
    with claim(Path(out), notice):
        prepare_out(out, force)
        check_space_for(cfg, Path(out))
        return _export_model(cfg, Path(out), force, progress, notice, swap_hook)


def _export_model(cfg: ExportConfig, out: Path, force: bool, progress: Progress, notice: Notice,
                  swap_hook: Hook | None) -> ExportResult:
    """The result's seconds and steps cover the whole stage, loading and calibration included (they are
    most of it), not only the graphs."""
    from dipdeploy.checkpoint import check_weights
    from dipdeploy.export.prepare import make_plan, merge_lora, stream_lora
    from dipdeploy.loading import load_model

    t0, steps = time.perf_counter(), _Steps(progress)
    stream = _should_stream(cfg)
    steps("load (streamed: one layer at a time)" if stream else "load")
    lm = load_model(cfg.model, stream=stream)
    extra = {}
    if stream:
        extra["streamed"] = True
        cfg = dataclasses.replace(cfg, validate_tokens=0)  # no whole torch model to validate against
    if cfg.lora is not None:
        steps("merge LoRA" if not stream else "LoRA (merged as each layer is read)")
        extra["lora"] = (stream_lora if stream else merge_lora)(lm, cfg.lora)
    if not stream:  # a streamed export checks each tensor as it is read (StreamedCheckpoint.materialise)
        check_weights(lm.model, cfg.model)
    counter = steps("plan" if cfg.plan or cfg.rho_in is not None or cfg.method == "dense" else "calibrate")
    plan = make_plan(lm, cfg, counter)
    steps()
    result = export(lm, cfg, out, plan, force=force, progress=progress, extra=extra, notice=notice,
                    swap_hook=swap_hook)
    return dataclasses.replace(result, seconds=time.perf_counter() - t0, steps={**steps.seconds, **result.steps})
