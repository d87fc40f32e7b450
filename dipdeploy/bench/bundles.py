"""Which bundle a benchmark row runs, and how: a registry model exported once per method and density into
the bench's bundle cache, or a bundle folder run as it is.

The methods are the README's: ``dense`` is the fair dense baseline (a ρ = 1 DIP bundle, every row
selected, run with ``static`` pinning: its most used rows stay in DRAM, the rest streams), ``dip`` and
``dip-ca`` a bundle of that method at the row's density, run with the engine's default policy and, for
DIP-CA, the γ the export baked in. Exports use a uniform plan with ρ_in = ``INPUT_SHARE`` × ρ (capped at
1), as ``dipdeploy demo`` does, so no calibration search runs; the MLP weights are quantised as
``quant`` says. A cached bundle is reused when its manifest records the same model, method, density,
split and quantisation; a folder at that path that records anything else is refused, never overwritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: the methods a benchmark row names (``--method``)
METHODS = ("dense", "dip", "dip-ca")
#: ρ_in / ρ of the uniform plans exported here (``dipdeploy.demo.DemoConfig.input_share``)
INPUT_SHARE = 1.1
#: tokens the export validates against torch: enough to catch a broken graph, few enough to stay short
VALIDATE_TOKENS = 8

Notice = Callable[[str], None]


@dataclass(frozen=True)
class BundleSpec:
    """One bundle a row runs: ``path``, the row's labels (``model``, ``method``, ``density``) and the
    cache policy the engine runs it with (None: the engine's default). ``export``: the registry model to
    export to ``path`` when it holds no bundle yet (None: a bundle folder given by the user)."""

    model: str
    method: str
    density: float
    path: Path
    policy: str | None = None
    export: str | None = None
    quant: str = "bq4"


def is_bundle(target: str) -> bool:
    from dipdeploy.bundle.names import MANIFEST

    return (Path(target) / MANIFEST).is_file()


def check_model(target: str) -> None:
    """``-m`` names a bundle folder or a model ``dipdeploy export`` takes (a registry name, a Hugging Face
    folder); anything else is refused in one line before any work."""
    if is_bundle(target):
        return
    from dipdeploy.registry import is_registered

    if not is_registered(target) and not (Path(target) / "config.json").is_file():
        raise ValueError(f"-m {target} is neither a bundle folder (from `dipdeploy export`) nor a model of the "
                         f"registry (`dipdeploy models`) or a Hugging Face model folder")
    from dipdeploy.loading import check_model as loadable

    loadable(target)


def _label(target: str) -> str:
    """A model's name in rows and cache folders: the registry name, or the folder's own name."""
    name = Path(target).name if ("/" in target or Path(target).is_dir()) else target
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "model"


def _export_fields(method: str, density: float) -> dict:
    if method == "dense":
        return {"method": "dip", "density": 1.0, "rho_in": 1.0}
    return {"method": method, "density": density, "rho_in": round(min(1.0, INPUT_SHARE * density), 6)}


def cache_folder(cache: Path, model: str, method: str, density: float, quant: str) -> Path:
    label = f"{_label(model)}-{method}" + ("" if method == "dense" else f"-r{density:g}") + f"-{quant}"
    return Path(cache) / label


def specs_for(target: str, methods: tuple[str, ...], densities: tuple[float, ...], cache: Path,
              quant: str) -> list[BundleSpec]:
    """The bundles one ``-m`` value gives: a bundle folder once (its own method and density; a ρ = 1 DIP
    bundle is run and labelled as ``dense``), a model once per method and density (``dense`` once)."""
    if is_bundle(target):
        return [bundle_spec(Path(target))]
    out = []
    for method in methods:
        for density in ((1.0,) if method == "dense" else densities):
            spec = BundleSpec(_label(target), method, density, cache_folder(cache, target, method, density, quant),
                              policy="static" if method == "dense" else None, export=target, quant=quant)
            if spec not in out:
                out.append(spec)
    return out


def plan_density(plan: dict) -> float:
    """A plan's MLP density: the mean over layers of the rows selected, up|gate counted twice as in
    ``benchmarks/runtime.py``."""
    d, f = plan["hidden_size"], plan["intermediate_size"]
    layers = plan["layers"]
    return round(sum((2 * lp["k_in"] / d + lp["k_glu"] / f) / 3 for lp in layers) / len(layers), 4)


def bundle_spec(path: Path) -> BundleSpec:
    from dipdeploy.bundle.manifest import read_manifest

    m = read_manifest(path)
    density = plan_density(m.plan) if m.plan else 1.0
    dense = m.method == "dense" or (m.method == "dip" and density >= 1.0)
    quant = (m.export_config or {}).get("quant", "none")
    return BundleSpec(path.name, "dense" if dense else m.method, density, path,
                      policy="static" if dense and m.plan else None, quant=quant)


def _matches(path: Path, spec: BundleSpec) -> bool:
    from dipdeploy.bundle.manifest import read_manifest

    cfg = read_manifest(path).export_config or {}
    want = {"model": spec.export, "quant": spec.quant, **_export_fields(spec.method, spec.density)}
    return all(cfg.get(k) == v for k, v in want.items())


def ensure(spec: BundleSpec, notice: Notice = lambda line: None) -> Path:
    """The bundle of ``spec``: exported into the cache when it is missing (the export's progress to
    ``notice``), reused when it matches, refused when the folder holds something else."""
    from dipdeploy.bundle.names import MANIFEST

    if spec.export is None:
        return spec.path
    if (spec.path / MANIFEST).is_file():
        if not _matches(spec.path, spec):
            raise FileExistsError(f"{spec.path} holds a bundle of another export (model, method, density or quant "
                                  f"differ); remove it or give another --bundle-cache")
        return spec.path
    if spec.path.exists() and any(spec.path.iterdir()):
        raise FileExistsError(f"{spec.path} exists and holds no bundle; remove it or give another --bundle-cache")
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    notice(f"exporting {spec.path} (once; later runs reuse it)")
    cfg = ExportConfig(model=spec.export, quant=spec.quant, validate_tokens=VALIDATE_TOKENS,
                       **_export_fields(spec.method, spec.density))
    export_model(cfg, spec.path, force=True, progress=lambda step: notice(f"  export: {step}"), notice=notice)
    return spec.path
