"""RunData: what the report gathered from one run folder, handed from build.py to page.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.metrics import HarnessSummary
from harnessrl.triage import HarnessTriage


@dataclass
class RunData:
    """One run's numbers per harness (summary, triage, per-task scores) and how complete it is."""

    folder: Path
    label: str  # "" for a single run, "A" / "B" in a comparison
    config: dict
    attempts: int
    harnesses: list[str]
    summaries: dict[str, HarnessSummary] = field(default_factory=dict)
    triage: dict[str, HarnessTriage] = field(default_factory=dict)
    task_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    families: set[str] = field(default_factory=set)
    n_found: int = 0
    n_planned: int | None = None
    has_summary: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.n_planned is not None and self.n_found < self.n_planned

    @property
    def title(self) -> str:
        c = self.config
        parts = [str(c[k]) for k in ("suite", "split", "model") if c.get(k) is not None]
        return " / ".join(parts) or self.folder.name
