"""The evolution loop: noise first, then propose -> validate -> measure -> confirm -> accept, then
held-out once.

    noise     seed harness x dev tasks x R rollouts, twice -> threshold (acceptance.py)
    iteration i = 1..N:
      re-measure the incumbent on dev (label iNN.incumbent)
      triage it; the proposer reads the triage and its failing episodes -> candidates
      each valid candidate: dev run (label iNN.cK) -> paired delta vs THIS iteration's incumbent run
      candidates with delta > threshold: confirmation runs on fresh samples, the incumbent's
      (iNN.incumbent.confirm) and each of theirs (iNN.cK.confirm); the best confirmation delta
      that is again > threshold becomes the incumbent
    final     seed and best harness on the held-out test tasks, once; the folder is then locked

Every measurement is a set of runner jobs stored in ONE run database under its own harness label
(`noise.a`, `i03.incumbent`, `i03.c2`, `test.best`, ...), so a killed loop resumes without
re-running finished episodes. Proposals are written to `proposals/iNN.json` before they are
measured (a resumed loop never asks the proposer again for the same iteration), evolution.jsonl
lines and state.json are written when an iteration completes. Test-split tasks are refused by
`measure` before the final phase.

Sampling streams. Each measurement samples with a seed derived from the run's seed and the name
of its stream (`stream_seed`), never from anything a process counts, so a resumed run gives every
measurement the seed it had before the kill. `noise.a` and `noise.b` have a stream each (the noise
estimate needs two independent looks). The arms of one comparison share one: iteration i's
incumbent and candidates sample from `iNN` (common random numbers: the comparison is paired), its
confirmation runs from `iNN.confirm`, the held-out runs from `test`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from harnessrl.errors import JobError
from harnessrl.evolve.acceptance import (
    acceptance_threshold,
    compare,
    confirmed_choice,
    estimate_noise,
    score_resolution,
    screening_winners,
    unseen_rate_floor,
)
from harnessrl.evolve.config import EvolveConfig
from harnessrl.evolve.edits import renamed, spec_diff, spec_fingerprint
from harnessrl.evolve.proposers import Proposal, ProposalContext, Proposer, worked_example
from harnessrl.executors import Executor, ExecutorError, LocalExecutor
from harnessrl.harness.spec import HarnessSpec, parse_spec, require_loop_harness
from harnessrl.metrics import HarnessSummary, harness_summary, paired_difference, task_scores
from harnessrl.models.base import Policy, SamplingParams
from harnessrl.results import EvolveResult, HeldOutRecord
from harnessrl.rollout import Runner, make_jobs
from harnessrl.rundir import RunFolder
from harnessrl.tasks.base import Task
from harnessrl.triage import HarnessTriage, triage_by_harness
from harnessrl.types import Trajectory

# Options a resume may change: a longer search continues, a shorter one goes on to the held-out
# test once that many iterations are done.
RESUMABLE_CHANGES = ("iterations", "device")
STATE = "state.json"
LOG = "evolution.jsonl"
BEST = "best_harness.yaml"
FINAL = "final.json"
SEED_LABEL = "seed"


class EvolveError(JobError):
    """A user-facing problem with an evolution run folder (finished, mismatched, ...)."""


def stream_seed(run_seed: int, stream: str) -> int:
    """The sampling seed of a measurement stream: 31 bits of sha256(run seed, stream name).

    A function of names only, so a resumed process derives the same seed, and streams of one run
    (or of runs with neighbouring seeds) do not share noise."""
    digest = hashlib.sha256(f"harnessrl-evolve:{run_seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def episode_scores(trajectories: list[Trajectory]) -> dict[str, list[float]]:
    """Every valid episode's score per task: the episodes `task_scores` averages (infra errors
    left out, an ungraded episode scores 0)."""
    out: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        if not t.is_infra_error:
            out[t.task_id].append(t.grade.score if t.grade is not None else 0.0)
    return dict(out)


@dataclass
class Confirmation:
    """The re-measure on fresh samples of a candidate that beat the threshold once."""

    incumbent_dev: dict[str, Any]
    dev: dict[str, Any] | None = None
    delta: float | None = None
    delta_ci95: list[float] | None = None
    beats_threshold: bool = False
    error: str | None = None


@dataclass
class CandidateLine:
    """One line of evolution.jsonl: a proposal, how it was measured and what was decided."""

    iteration: int
    candidate: str  # its label, e.g. i03.c2
    parent: str  # the incumbent it was proposed against
    proposer: str
    edit: str | None
    hypothesis: str | None
    target: str | None
    incumbent_dev: dict[str, Any]
    threshold: float | None
    error: str | None = None
    diff: list[Any] = field(default_factory=list)
    spec_fingerprint: str | None = None
    status: str = "measured"  # measured, invalid, no-op, crashed
    dev: dict[str, Any] | None = None
    delta: float | None = None
    delta_ci95: list[float] | None = None
    beats_threshold: bool = False
    confirmation: Confirmation | None = None
    accepted: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Measurement:
    label: str
    seed: int  # the sampling seed it ran with (from its stream)
    trajectories: list[Trajectory]
    scores: dict[str, float]  # per-task mean score
    summary: HarnessSummary

    def dev_record(self) -> dict[str, Any]:
        s = self.summary
        return {
            "label": self.label,
            "mean": s.mean_score,
            "ci95": s.mean_score_ci95,
            "n_episodes": s.n_episodes,
            "delivery_rate": s.delivery_rate,
            "n_infra_errors": s.n_infra_errors,
            "seed": self.seed,
        }


@dataclass
class State:
    phase: str = "search"  # search -> final -> finished
    iterations_done: int = 0
    incumbent: str = SEED_LABEL  # label of the incumbent's spec under harnesses/
    noise: dict[str, Any] | None = None
    threshold: float | None = None
    invalid_proposals: int = 0
    crashed_candidates: int = 0
    unconfirmed_candidates: int = 0  # beat the threshold once, not again on fresh samples
    exhausted: bool = False  # the proposer had nothing left to propose
    stopped_by: str | None = None  # the caller's stop_when reason that ended the search, if one did
    elapsed_s: float = 0.0
    accepted: list[str] = field(default_factory=list)


class Evolution:
    def __init__(
        self,
        folder: str | Path,
        config: EvolveConfig,
        seed_spec: HarnessSpec,
        dev_tasks: list[Task],
        test_tasks: list[Task],
        policy: Policy,
        proposer: Proposer,
        progress: bool = False,
        log: Callable[[str], None] = lambda _: None,
        example_tasks: list[Task] | None = None,
        executor: Executor | None = None,
        stop_when: Callable[[int], str | None] | None = None,
    ):
        self.folder = Path(folder)
        self.stop_when = stop_when
        self.executor = executor if executor is not None else LocalExecutor()  # the caller closes it
        self.config = config
        self.seed_spec = seed_spec
        self.dev_tasks = dev_tasks
        self.test_tasks = test_tasks
        self.policy = policy
        self.proposer = proposer
        self.progress = progress
        self.log = log
        self._mark = time.monotonic()  # when elapsed_s was last brought up to date (run() restarts it)
        if any(t.split != "train" for t in example_tasks or []):
            raise EvolveError("worked examples for the proposer must come from the train split")
        self._worked_example = worked_example(list(example_tasks or []))  # replayed once, shown every iteration
        if any(t.split == "test" for t in dev_tasks):
            raise EvolveError("the dev tasks include test-split tasks; held-out tasks are for the final run only")

    # -- files -----------------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self.folder / name

    def _write(self, name: str, text: str) -> None:
        """Atomic write: a kill leaves the old file or the new one, never half of one."""
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _save_state(self, state: State) -> None:
        now = time.monotonic()
        state.elapsed_s = round(state.elapsed_s + now - self._mark, 3)
        self._mark = now
        self._write(STATE, json.dumps(asdict(state), indent=1) + "\n")

    def _load_state(self) -> State | None:
        p = self._path(STATE)
        if not p.is_file():
            return None
        known = set(State.__dataclass_fields__)
        return State(**{k: v for k, v in json.loads(p.read_text(encoding="utf-8")).items() if k in known})

    def _save_spec(self, label: str, spec: HarnessSpec) -> None:
        self._write(f"harnesses/{label}.yaml", spec.to_yaml())

    def _load_spec(self, label: str) -> HarnessSpec:
        p = self._path(f"harnesses/{label}.yaml")
        # every spec the loop saves is one it edits: a loop harness (never an external one)
        spec = parse_spec(yaml.safe_load(p.read_text(encoding="utf-8")), str(p))
        return require_loop_harness(spec, "evolution")

    def _log_lines(self) -> list[dict[str, Any]]:
        p = self._path(LOG)
        if not p.is_file():
            return []
        return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]

    # -- measuring ------------------------------------------------------------------------------------
    def measure(self, spec: HarnessSpec, label: str, tasks: list[Task], stream: str, phase: str) -> Measurement:
        """Run spec on tasks x rollouts under `label` (resuming finished episodes), sampling from
        `stream`, and score it."""
        seed = stream_seed(self.config.seed, stream)
        if phase != "final" and any(t.split == "test" for t in tasks):
            raise EvolveError(f"{label}: test-split tasks may only be run in the final phase")
        run_spec = renamed(spec, label)
        self.run_folder.record_shell_isolation([run_spec], any(t.offers_shell for t in tasks))
        jobs = make_jobs(tasks, [run_spec], self.config.rollouts)
        todo = self.run_folder.todo(jobs)
        if todo:
            self.log(
                f"{label}: {len(todo)} episodes"
                + (f" ({len(jobs) - len(todo)} already done)" if len(todo) < len(jobs) else "")
            )
            sampling = SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p, seed=seed)
            runner = Runner(
                self.policy,
                sampling,
                max_in_flight=self.config.max_in_flight,
                max_retries=self.config.retries,
                on_episode=self.store.add,
                progress=self.progress,
                executor=self.executor,
            )
            runner.run(todo)
        trajs = list(self.store.trajectories(harness=label, with_tokens=False))
        return Measurement(label, seed, trajs, task_scores(trajs), harness_summary(trajs, self.config.rollouts))

    def run(self) -> EvolveResult:
        self._mark = time.monotonic()
        # a folder with a state holds a run that this start continues (the CLI's --resume)
        resume = self._path(STATE).is_file()
        self.run_folder = RunFolder.open(
            self.folder, "evolution", self.config.to_json(), resume=resume, may_differ=RESUMABLE_CHANGES
        ).start()
        self.run_folder.record(executor=self.executor.describe())  # a resumed run may run elsewhere
        state = self._load_state()
        if state is None:
            self._save_spec(SEED_LABEL, self.seed_spec)
            state = State()
            self._save_state(state)
        self.store = self.run_folder.store(meta_config={"evolve": self.config.to_json(), "model": self.config.model})
        try:
            # lines of an iteration that did not complete are written again when it completes
            kept = [line for line in self._log_lines() if line["iteration"] <= state.iterations_done]
            self._write(LOG, "".join(json.dumps(line) + "\n" for line in kept))
            if state.threshold is None:
                self._noise(state)
            while state.phase == "search" and state.iterations_done < self.config.iterations and not state.exhausted:
                if self._stopped(state):
                    break
                self._iteration(state, state.iterations_done + 1)
            if state.phase == "search":
                self._stopped(state)  # after the last iteration too: final.json says who ended the search
            state.phase = "final"
            self._save_state(state)
            return self._final(state)
        finally:
            self.run_folder.close()

    def _stopped(self, state: State) -> bool:
        """Whether the caller's stop_when ends the search after the iterations done so far (asked
        again on resume, so a kill between an iteration and its answer changes nothing)."""
        if state.stopped_by is None and self.stop_when is not None and state.iterations_done > 0:
            reason = self.stop_when(state.iterations_done)
            if reason:
                state.stopped_by = str(reason)
                self._save_state(state)
                self.log(f"iteration {state.iterations_done}: stopped ({state.stopped_by}); the held-out phase follows")
        return state.stopped_by is not None

    def _noise(self, state: State) -> None:
        seed_spec = self._load_spec(SEED_LABEL)
        # two streams: a resumed run must not replay noise.a's samples as noise.b (sd would be 0)
        a = self.measure(seed_spec, "noise.a", self.dev_tasks, "noise.a", "search")
        b = self.measure(seed_spec, "noise.b", self.dev_tasks, "noise.b", "search")
        noise = estimate_noise(a.scores, b.scores, episode_scores(a.trajectories), episode_scores(b.trajectories))
        resolution = score_resolution(len(self.dev_tasks), self.config.rollouts)
        episodes = 2 * len(self.dev_tasks) * self.config.rollouts
        unseen = unseen_rate_floor(noise, episodes, self.config.threshold_multiple)
        state.noise = noise.to_json() | {
            "runs": [a.dev_record(), b.dev_record()],
            "threshold_multiple": self.config.threshold_multiple,
            "min_threshold": self.config.min_threshold,
            "score_resolution": resolution,
            "unseen_rate_floor": unseen,
        }
        floor = max(self.config.min_threshold, resolution, unseen)
        state.threshold = acceptance_threshold(noise, self.config.threshold_multiple, floor)
        self._write("noise.json", json.dumps(state.noise | {"threshold": state.threshold}, indent=1) + "\n")
        self._write(BEST, seed_spec.to_yaml())
        self._save_state(state)
        self.log(f"noise: sd of the dev mean {noise.sd_dev_mean:.4f}, threshold {state.threshold:.4f}")
        if noise.degenerate:
            # e.g. greedy decoding, or a few tasks that fail the same way every time: no spread seen
            why = (
                f"every one of the {episodes} seed episodes scored {noise.mean_a:g}, so a rate up to ~3/{episodes} "
                f"could hide there: the threshold is the noise it would make, {unseen:.4f}"
                if unseen
                else f"the threshold is its floor {state.threshold:.4f} (the larger of one episode's worth of score, "
                f"1/(dev tasks x rollouts) = {resolution:.4f}, and --min-threshold)"
            )
            self.log(
                "warning: the two seed runs agree on every dev task and every attempt, so the noise estimate is 0; "
                f"{why}; use more dev tasks or rollouts, or set --min-threshold"
            )

    def _proposals(self, iteration: int, ctx: ProposalContext) -> list[Proposal]:
        """This iteration's proposals: from proposals/iNN.json when a killed run left them."""
        name = f"proposals/i{iteration:02d}.json"
        if self._path(name).is_file():
            return [Proposal.from_json(d) for d in json.loads(self._path(name).read_text(encoding="utf-8"))]
        try:
            proposals = self.proposer.propose(ctx)
        except Exception as e:  # a proposer bug or a dead server: recorded, the loop goes on
            proposals = [Proposal("", "", self.proposer.name, None, error=f"proposer failed: {type(e).__name__}: {e}")]
        self._write(name, json.dumps([p.to_json() for p in proposals], indent=1) + "\n")
        return proposals

    def _iteration(self, state: State, it: int) -> None:
        incumbent = self._load_spec(state.incumbent)
        inc = self.measure(incumbent, f"i{it:02d}.incumbent", self.dev_tasks, f"i{it:02d}", "search")
        tri = triage_by_harness(inc.trajectories).get(inc.label) or HarnessTriage.empty()
        failed_ids = {v.episode_id for v in tri.episodes}
        history = self._log_lines()
        tools = {t.name: t.schema for task in self.dev_tasks for t in task.tools}
        ctx = ProposalContext(
            iteration=it,
            incumbent=incumbent,
            triage=tri.to_json(),
            failures=[t for t in inc.trajectories if t.episode_id in failed_ids],
            history=history,
            tools=list(tools.values()),
            n=self.config.candidates,
            tried={h["spec_fingerprint"] for h in history if h.get("spec_fingerprint")},
            worked_example=self._worked_example,
        )
        proposals = self._proposals(it, ctx)
        if not proposals:
            state.exhausted = True
            self.log(f"iteration {it}: the proposer has nothing left to propose; stopping the search")
        lines = []
        for k, p in enumerate(proposals, 1):
            lines.append(self._candidate(state, it, k, p, incumbent, inc))
        chosen = self._confirm(state, it, incumbent, lines)
        if chosen is not None:
            best = next(line for line in lines if line.candidate == chosen)
            best.accepted = True
            state.incumbent = chosen
            state.accepted.append(chosen)
            self._write(BEST, renamed(self._load_spec(chosen), self._best_name()).to_yaml())
        with open(self._path(LOG), "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line.to_json()) + "\n")
            f.flush()
            os.fsync(f.fileno())
        state.iterations_done = it
        self._save_state(state)
        verdicts = ", ".join(self._verdict_text(line) for line in lines)
        self.log(f"iteration {it}: incumbent {inc.summary.mean_score}, {verdicts}")

    @staticmethod
    def _verdict_text(line: CandidateLine) -> str:
        text = f"{line.candidate} {line.status} delta={line.delta}"
        if line.confirmation is not None:
            text += f" confirmation delta={line.confirmation.delta}"
            confirmed = line.confirmation.beats_threshold
            text += " ACCEPTED" if line.accepted else " confirmed" if confirmed else " not confirmed"
        return text

    def _confirm(self, state: State, it: int, incumbent: HarnessSpec, lines: list[CandidateLine]) -> str | None:
        """Re-measure every screening winner and the incumbent on fresh samples (stream iNN.confirm);
        the label of the candidate to accept, or None. Fills each winner's `confirmation`."""
        threshold = _threshold(state)
        screened = {line.candidate: line.delta for line in lines if line.beats_threshold}
        winners = screening_winners(screened, threshold)
        if not winners:
            return None
        stream = f"i{it:02d}.confirm"
        inc = self.measure(incumbent, f"i{it:02d}.incumbent.confirm", self.dev_tasks, stream, "search")
        by_label = {line.candidate: line for line in lines}
        deltas: dict[str, float | None] = {}
        for label in winners:
            conf = Confirmation(incumbent_dev=inc.dev_record())
            by_label[label].confirmation = conf
            try:
                cand = self.measure(self._load_spec(label), f"{label}.confirm", self.dev_tasks, stream, "search")
            except ExecutorError:  # where the episodes run broke, not the candidate: the run cannot go on
                raise
            except Exception as e:  # as in screening: a candidate that breaks the runner is skipped
                state.crashed_candidates += 1
                by_label[label].status = "crashed"
                conf.error = by_label[label].error = f"{type(e).__name__}: {e}"
                continue
            verdict = compare(inc.scores, cand.scores, threshold)
            conf.dev, conf.delta = cand.dev_record(), verdict.delta
            conf.delta_ci95, conf.beats_threshold = verdict.delta_ci95, verdict.accepted
            deltas[label] = verdict.delta
            if not verdict.accepted:
                state.unconfirmed_candidates += 1
        return confirmed_choice(deltas, threshold)

    def _best_name(self) -> str:
        return f"{self.seed_spec.name}-evolved"[:64]

    def _candidate(
        self, state: State, it: int, k: int, p: Proposal, incumbent: HarnessSpec, inc: Measurement
    ) -> CandidateLine:
        label = f"i{it:02d}.c{k}"
        line = CandidateLine(
            iteration=it,
            candidate=label,
            parent=state.incumbent,
            proposer=self.proposer.name,
            edit=p.edit,
            hypothesis=p.hypothesis,
            target=p.target,
            incumbent_dev=inc.dev_record(),
            threshold=state.threshold,
            error=p.error,
        )
        if p.spec is None:
            state.invalid_proposals += 1
            line.status = "invalid"
            return line
        line.diff = spec_diff(incumbent, p.spec)
        line.spec_fingerprint = spec_fingerprint(p.spec)
        if not line.diff:
            line.status = "no-op"
            line.error = "the candidate is identical to the incumbent"
            return line
        self._save_spec(label, p.spec)
        try:
            cand = self.measure(p.spec, label, self.dev_tasks, f"i{it:02d}", "search")
        except ExecutorError:  # where the episodes run broke, not the candidate: the run cannot go on
            raise
        except Exception as e:  # a candidate that breaks the runner is skipped, not fatal
            state.crashed_candidates += 1
            line.status = "crashed"
            line.error = f"{type(e).__name__}: {e}"
            return line
        verdict = compare(inc.scores, cand.scores, _threshold(state))
        line.dev, line.delta = cand.dev_record(), verdict.delta
        line.delta_ci95, line.beats_threshold = verdict.delta_ci95, verdict.accepted
        return line

    # -- held-out, once -------------------------------------------------------------------------------
    def _final(self, state: State) -> EvolveResult:
        seed_spec = self._load_spec(SEED_LABEL)
        best_spec = self._load_spec(state.incumbent)
        # one stream for both sides: the held-out comparison is paired like an iteration's
        seed_run = self.measure(seed_spec, "test.seed", self.test_tasks, "test", "final")
        # with no accepted edit, best IS the seed: one held-out run serves both sides
        best_run = (
            seed_run
            if state.incumbent == SEED_LABEL
            else self.measure(best_spec, "test.best", self.test_tasks, "test", "final")
        )
        self._save_state(state)  # brings elapsed_s up to date
        final = EvolveResult(
            suite=self.config.suite,
            model=self.config.model,
            seed_harness=self.seed_spec.name,
            best=state.incumbent,
            accepted_edits=state.accepted,
            best_diff_vs_seed=spec_diff(seed_spec, best_spec),
            iterations_run=state.iterations_done,
            proposer_exhausted=state.exhausted,
            stopped_by=state.stopped_by,
            threshold=state.threshold,
            noise=state.noise,
            invalid_proposals=state.invalid_proposals,
            crashed_candidates=state.crashed_candidates,
            unconfirmed_candidates=state.unconfirmed_candidates,
            seed=self._held_out_record(seed_run),
            best_harness=self._held_out_record(best_run),
            paired_difference=paired_difference(seed_run.scores, best_run.scores),
            config=self.config.to_json(),
            wall_time_s=state.elapsed_s,
        )
        self._write(BEST, renamed(best_spec, self._best_name() if state.accepted else self.seed_spec.name).to_yaml())
        self._write(FINAL, json.dumps(final.model_dump(), indent=1) + "\n")
        state.phase = "finished"
        self._save_state(state)
        self.run_folder.lock(f"{FINAL} is written")  # written last, after final.json
        return final

    def _held_out_record(self, m: Measurement) -> HeldOutRecord:
        s = m.summary
        t = triage_by_harness(m.trajectories).get(m.label) or HarnessTriage.empty()
        return HeldOutRecord(
            label=m.label,
            mean_score=s.mean_score,
            mean_score_ci95=s.mean_score_ci95,
            pass_at_k=s.pass_at_k,
            pass_hat_k=s.pass_hat_k,
            delivery_rate=s.delivery_rate,
            n_tasks=s.n_tasks,
            n_episodes=s.n_episodes,
            n_infra_errors=s.n_infra_errors,
            triage={
                "n_failed": t.n_failed,
                "counts": t.counts,
                "rates": t.rates,
                "process_share": t.process_share,
                "content_share": t.content_share,
            },
        )


def _threshold(state: State) -> float:
    """The acceptance threshold: the noise phase sets it before the first search iteration."""
    if state.threshold is None:
        raise EvolveError("the search cannot run before the noise phase has set the acceptance threshold")
    return state.threshold
