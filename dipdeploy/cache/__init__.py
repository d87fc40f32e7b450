"""DRAM weight-cache policies and the DIP-CA score: the one definition shared by the torch reference,
the host runtime, the simulator, the ONNX fallback's tests and the Java engine's golden vectors.

Floor 2: numpy only.
"""

from dipdeploy.cache.policies import POLICIES, POLICY_RECORDS, Policy, RowCache, policy_of, static_rows
from dipdeploy.cache.score import dipca_scores, gamma_at, topk_indices, topk_rows
from dipdeploy.cache.slots import SlotStep, SlotTable

__all__ = ["POLICIES", "POLICY_RECORDS", "Policy", "RowCache", "policy_of", "static_rows", "dipca_scores", "gamma_at",
           "topk_indices", "topk_rows",
           "SlotStep", "SlotTable"]
