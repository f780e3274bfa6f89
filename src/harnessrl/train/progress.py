"""Progress of a training run, one record per optimizer step (GRPO) or logged step (SFT): a rich
bar on a terminal, a plain line per step otherwise (CI logs, `| tee`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class StepProgress:
    """A rich bar over the optimizer steps on a terminal; a plain line per step otherwise (CI logs,
    `| tee`). A subclass names the bar's own columns (`columns`: field -> column text), what a
    step's record shows in them (`shown`) and as a line (`line`)."""

    title = "step"
    columns: dict[str, str] = {}

    def __init__(self, console, total: int, done: int, enabled: bool):
        self.console, self.total, self.done, self.enabled = console, total, done, enabled
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def shown(self, r: dict[str, Any]) -> dict[str, str]:
        raise NotImplementedError

    def line(self, r: dict[str, Any]) -> str:
        raise NotImplementedError

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
            fields: dict[str, Any] = self.shown(r)
            self.bar.update(self.task, completed=r["step"], **fields)
        elif self.enabled:
            self.console.print(self.line(r), highlight=False, markup=False)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


class GRPOProgress(StepProgress):
    """`harnessrl train grpo`: the harness of the step and its mean reward."""

    columns = {"harness": "{task.fields[harness]}", "reward": "reward {task.fields[reward]}"}

    def shown(self, r: dict[str, Any]) -> dict[str, str]:
        return {"harness": r["harness"], "reward": shown_value(r["reward_mean"], ".3f")}

    def line(self, r: dict[str, Any]) -> str:
        return (
            f"step {r['step']}/{self.total}  {r['harness']}  reward {shown_value(r['reward_mean'], '.3f')}  "
            f"|A| {shown_value(r['adv_abs_mean'], '.3f')}  loss {shown_value(r['loss'], '.4f')}  "
            f"{'update' if r['optimizer_step'] else 'skipped'}  {r['time']['total']:.1f} s"
        )


def shown_value(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
