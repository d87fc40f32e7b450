"""Sparse MLP methods (torch), the sparsity plan and its calibration."""
