"""One row of doctor's report: a check, its state and what it found (the Slurm and the PBS checks alike)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Check:
    name: str
    state: Literal["ok", "warn", "fail"]
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "state": self.state, "detail": self.detail}
