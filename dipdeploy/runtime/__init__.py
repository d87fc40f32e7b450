"""The host runtime (floor 5, torch-free): a bundle's per-layer graphs with ONNX Runtime, the MLP rows
in a DRAM cache over the Flash-backed weight file. ``Engine(bundle, ...).generate(prompt)``; the CLI's
``dipdeploy run`` and ``dipdeploy chat`` wrap it."""

from dipdeploy.bundle.manifest import BundleError
from dipdeploy.runtime.budget import DramBudget, parse_bandwidth, parse_bytes
from dipdeploy.runtime.bundle_open import open_bundle
from dipdeploy.runtime.config import EngineConfig
from dipdeploy.runtime.engine import Engine, Generation
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.stats import RunStats

__all__ = ["BundleError", "DramBudget", "Engine", "EngineConfig", "Generation", "RunStats", "Sampler",
           "open_bundle", "parse_bandwidth", "parse_bytes"]
