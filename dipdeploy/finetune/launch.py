"""Which of the data-parallel processes this one is, from the variables every PyTorch launcher sets
(``accelerate launch``, ``torchrun``: ``RANK``, ``WORLD_SIZE``), read without importing torch so the
CLI can decide before any work who prints and who writes (only process 0; docs/finetune.md)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: Seconds a refusing process other than 0 gives process 0 to say why and exit (see
#: :meth:`ProcessInfo.await_main_refusal`); the launcher ends the waiting process as soon as process 0 exits.
REFUSAL_WAIT_S = 60.0


@dataclass(frozen=True)
class ProcessInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def await_main_refusal(self, wait_s: float = REFUSAL_WAIT_S) -> None:
        """Let process 0 be the one that reports a refusal every process makes alike.

        A launcher (torch elastic, under ``accelerate launch``) ends every other process as soon as one
        exits with an error. A process other than 0 that refused and exited at once could therefore take
        process 0 down before it printed the error line (seen under load). So it sleeps instead, until the
        launcher ends it after process 0's exit; if process 0 has not exited within ``wait_s``, the refusal
        was this process's own and it returns, for the caller to report it."""
        if not self.is_main:
            time.sleep(wait_s)

    @classmethod
    def from_env(cls) -> "ProcessInfo":
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
