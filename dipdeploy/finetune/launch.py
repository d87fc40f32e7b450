"""Which of the data-parallel processes this one is, from the variables every PyTorch launcher sets
(``accelerate launch``, ``torchrun``: ``RANK``, ``WORLD_SIZE``), read without importing torch so the
CLI can decide before any work who prints and who writes (only process 0; README, "LoRA recovery")."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "ProcessInfo":
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
