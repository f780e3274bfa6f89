"""Progress of a training run, one record per optimizer step (GRPO) or logged step (SFT): a rich
bar on a terminal, a plain line per step otherwise (CI logs, `| tee`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class StepView:
    """What a training job shows of a step's record: the bar's title, its own columns (field ->
    column text) and what fills them (`shown`), and the plain line (`line(record, total)`)."""

    title: str
    columns: dict[str, str]
    shown: Callable[[dict[str, Any]], dict[str, str]]
    line: Callable[[dict[str, Any], int], str]


class StepProgress:
    """A rich bar over the optimizer steps on a terminal; a plain line per step otherwise (CI logs,
    `| tee`), as `view` says (GRPO_VIEW, SFT_VIEW, DISTILL_VIEW)."""

    def __init__(self, view: StepView, console, total: int, done: int, enabled: bool):
        self.view = view
        self.title, self.columns = view.title, view.columns
        self.console, self.total, self.done, self.enabled = console, total, done, enabled
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self):
        if self.enabled and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            bar = self.bar = Progress(
                TextColumn(f"[bold]{self.title}"),
                BarColumn(),
                MofNCompleteColumn(),
                *(TextColumn(text) for text in self.columns.values()),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            bar.__enter__()
            fields: dict[str, Any] = dict.fromkeys(self.columns, "-")  # the columns' task fields
            self.task = bar.add_task(self.title, total=self.total, completed=self.done, **fields)
        return self

    def update(self, r: dict[str, Any]) -> None:
        if self.bar is not None and self.task is not None:
            fields: dict[str, Any] = self.view.shown(r)
            self.bar.update(self.task, completed=r["step"], **fields)
        elif self.enabled:
            self.console.print(self.view.line(r, self.total), highlight=False, markup=False)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


def shown_value(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# `harnessrl train grpo`: the harness of the step and its mean reward.
GRPO_VIEW = StepView(
    title="step",
    columns={"harness": "{task.fields[harness]}", "reward": "reward {task.fields[reward]}"},
    shown=lambda r: {"harness": r["harness"], "reward": shown_value(r["reward_mean"], ".3f")},
    line=lambda r, total: (
        f"step {r['step']}/{total}  {r['harness']}  reward {shown_value(r['reward_mean'], '.3f')}  "
        f"|A| {shown_value(r['adv_abs_mean'], '.3f')}  loss {shown_value(r['loss'], '.4f')}  "
        f"{'update' if r['optimizer_step'] else 'skipped'}  {r['time']['total']:.1f} s"
    ),
)

# `harnessrl train sft`: the loss of each logged step.
SFT_VIEW = StepView(
    title="sft step",
    columns={"loss": "loss {task.fields[loss]}"},
    shown=lambda r: {"loss": f"{r['loss']:.4f}"},
    line=lambda r, total: (
        f"step {r['step']}/{total}  epoch {r['epoch']}  loss {r['loss']:.4f}  "
        f"tokens {r['tokens']}  lr {r['lr']:.2e}  {r['seconds']:.1f} s"
    ),
)

# `harnessrl train distill`: the student's KL to the teacher and its reward.
DISTILL_VIEW = StepView(
    title="distill step",
    columns={"kl": "kl {task.fields[kl]}", "reward": "reward {task.fields[reward]}"},
    shown=lambda r: {"kl": shown_value(r["kl"], ".4f"), "reward": shown_value(r["reward_mean"], ".4f")},
    line=lambda r, total: (
        f"step {r['step']}/{total}  kl {shown_value(r['kl'], '.4f')}  "
        f"reward {shown_value(r['reward_mean'], '.4f')}  tokens {r['completion_tokens']}  {r['time']['total']:.1f} s"
    ),
)
