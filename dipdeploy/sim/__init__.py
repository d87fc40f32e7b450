"""The HW simulator (floor 4, numpy only): device profiles, memory placement, model-shape projection,
trace replay through the shared cache policies, and the throughput-vs-DRAM sweep (docs/method.md,
"The HW simulator")."""

from dipdeploy.sim.config import SIM_METHODS, SimConfig
from dipdeploy.sim.devices import DeviceProfile, FlashModel, get_device, list_devices
from dipdeploy.sim.precision import PRECISIONS, bits_per_weight, bytes_per_weight
from dipdeploy.sim.simulate import SimResult, simulate

__all__ = ["SIM_METHODS", "SimConfig", "DeviceProfile", "FlashModel", "get_device", "list_devices",
           "PRECISIONS", "bits_per_weight", "bytes_per_weight", "SimResult", "simulate"]
