#!/usr/bin/env python
"""Does choosing the harness of each GRPO step adaptively (scheduler harness-bandit) beat mixing
every trained harness into every step (mixed), measured on held-out tasks and on a harness never
trained on? Paired by task, two seeds, a single-harness reference.

Stages, in this order (the main comparison first); each is `harnessrl` commands (run in this
process) with run folders under --out. A finished stage is skipped on a rerun (its marker,
OUT/done/STAGE.json, is written last); an interrupted one resumes: a finished evaluation or
training run is skipped, an unfinished one continues from its folder (--resume). A rerun must
give the same options (OUT/options.json), but for --until and where the records go.

  warm-start   the supervised warm start (bench/doc 03, 04a): `harnessrl eval --model oracle` on
               the first --ws-tasks train tasks through json-tools and code-act, then `harnessrl
               train sft --as-harness own --pack` of --base-model on them, into --ws; skipped when
               WS/sft/adapter exists or --model is not `warm-start`.
  survey       the model on the first --survey-tasks dev tasks x --survey-attempts through each
               --candidates harness at --temperature; the choice of harnesses (`choose_harnesses`)
               from pass@k and pass^k: the trained ones (some with groups that disagree, some
               flat), one held out (never trained on) and the reference arm's. --trained and
               --held-out replace the choice (recorded as given).
  arms         `harnessrl train grpo` on the trained harnesses, first seed: harness-bandit and
               mixed on the same budget (--steps x --tasks-per-step x --group-size) and seed, so
               the same tasks are drawn at each step. Trained one step per command (`--steps k
               --resume`, which computes what one run would) to read the scheduler's state after
               every step from the checkpoint.
  evaluation   the model and both arms' adapters on the first --test-tasks test tasks x
               --attempts through every trained harness and the held-out one.
  second-seed  both arms again with the second seed, and their evaluations.
  reference    single:REFERENCE (the survey's best harness for GRPO) on the same budget, and its
               evaluation.

Reported: B - A paired by task with 95 % bootstrap intervals (harnessrl.metrics, as `harnessrl
compare`) for bandit - mixed (each seed and both pooled), each arm - the model, and against the
reference, per trained harness, pooled over the trained ones and on the held-out one, for the
mean score, pass@k and pass^k (k = --attempts); and per step of each arm the chosen harness, the
share of groups with signal, each harness's learnability and transferability and the
scheduler's probabilities. Every stage's per-task and per-step records go to OUT/records/ and,
with --records, to bench/results/records/bandit_gain/NAME/ (records/README.md), from which
bench/write_doc.py recomputes every interval it prints. Prints tables and one
`BANDIT_GAIN_JSON {...}` line.

    .venv/bin/python bench/bandit_gain.py --out runs/bandit-gain --records    # the experiment (hours)
    .venv/bin/python bench/bandit_gain.py --model tiny-random --steps 1 --tasks-per-step 2 \\
        --group-size 2 --survey-tasks 2 --survey-attempts 2 --test-tasks 2 --attempts 2 \\
        --trained react,hermes-tools,xml-tags --held-out plan-execute --out /tmp/bg   # plumbing only
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from results import (  # noqa: E402
    RECORDS_DIR,
    eval_rows,
    interval_text,
    read_lines,
    records_difference,
    records_level,
    task_values,
    train_rows,
    write_lines,
)

STAGES = ("warm-start", "survey", "arms", "evaluation", "second-seed", "reference")
WARM_START_HARNESSES = ("json-tools", "code-act")
ARMS = {"bandit": "harness-bandit", "mixed": "mixed"}
METRICS = ("mean", "pass@k", "pass^k")
RULE = (
    "signal = pass@k - pass^k over the survey's tasks (the share of tasks whose k attempts disagree: "
    "GRPO groups with signal); flat = no such task. Trained: the candidate with the most signal, the "
    "flat candidate with the highest mean, then the other candidates with signal, then the other flat "
    "ones, up to --trained-count. Held out (never trained on): the candidate second by signal. "
    "Reference arm: the first by signal. Ties: higher mean, then name. Needs two candidates with "
    "signal and one flat."
)


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def default_candidates() -> str:
    """Every built-in harness but the warm start's, and bench/specs/xml-tags-demo.yaml."""
    from harnessrl.harness.registry import builtin_names

    names = [n for n in builtin_names() if n not in WARM_START_HARNESSES]
    return ",".join([*names, _relative(BENCH / "specs" / "xml-tags-demo.yaml")])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="warm-start", help="warm-start (WS/sft/adapter, built by stage 0) or any --model")
    p.add_argument("--base-model", default="smollm2-135m", help="what the warm start fine-tunes")
    p.add_argument("--ws", default="runs/ws", help="the warm start's folder (oracle/, sft/)")
    p.add_argument("--ws-tasks", type=int, default=96, help="train tasks of the oracle episodes")
    p.add_argument("--ws-epochs", type=int, default=1)
    p.add_argument("--ws-lr", type=float, default=3e-4)
    p.add_argument("--suite", default="toolcalc")
    p.add_argument("--candidates", default=None, help="harnesses surveyed (names or specs; default: " + "every "
                   "built-in but json-tools and code-act, and bench/specs/xml-tags-demo.yaml)")  # fmt: skip
    p.add_argument("--survey-tasks", type=int, default=16, help="dev tasks of the survey")
    p.add_argument("--survey-attempts", type=int, default=4, help="k of the survey's pass@k and pass^k")
    p.add_argument("--trained-count", type=int, default=3, help="trained harnesses the survey's rule picks")
    p.add_argument("--trained", default=None, help="the trained harnesses (comma-separated), instead of the rule's")
    p.add_argument("--held-out", default=None, help="the held-out harness, instead of the rule's (with --trained)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--temperature", type=float, default=1.0, help="of the survey, the rollouts and the evaluations")
    p.add_argument("--test-tasks", type=int, default=72)
    p.add_argument("--attempts", type=int, default=2, help="attempts per test task and harness")
    p.add_argument("--seeds", default="0,1", help="the two training seeds (arms, second-seed)")
    p.add_argument("--eval-seed", type=int, default=0, help="sampling seed of the survey and every evaluation")
    p.add_argument("--out", default="runs/bandit-gain")
    p.add_argument("--until", choices=STAGES, default=None, help="stop after this stage")
    p.add_argument("--records", action="store_true", help="also write the records to bench/results/records/")
    p.add_argument("--records-dir", default=None, help="where --records writes (default: bench/results/records)")
    p.add_argument("--name", default=None, help="the records' folder name (default: --out's last part)")
    args = p.parse_args(argv)
    if (args.trained is None) != (args.held_out is None):
        p.error("--trained and --held-out go together")
    seeds = args.seeds.split(",")
    if len(seeds) != 2 or not all(s.strip().lstrip("-").isdigit() for s in seeds) or seeds[0] == seeds[1]:
        p.error(f"--seeds takes two different integers, got {args.seeds!r}")
    return args


# Each `harnessrl` command in a process of its own (set False by the tests, which run many tiny
# ones): the experiment runs dozens of them over hours, and in one process its memory grew to
# 18.5 GB by the evaluation stage (killed by the kernel's OOM killer on this 24 GB machine).
SUBPROCESS = True


def harnessrl(*args: str) -> None:
    """One `harnessrl` command, as the command line runs it (in a child process: SUBPROCESS)."""
    import click

    print("$ harnessrl " + shlex.join(args), flush=True)
    if SUBPROCESS:
        # Every arm generates through its LoRA adapter's own layers, as the seed-0 arms did (they ran
        # before the engine merged LoRA layers in its decode steps, which rounds differently): one
        # decode path for every arm of the experiment, unless HARNESSRL_MERGE_LORA is given.
        env = {**os.environ, "HARNESSRL_MERGE_LORA": os.environ.get("HARNESSRL_MERGE_LORA", "0")}
        command = [sys.executable, "-c", "from harnessrl.cli import main; main()", *args]
        code: Any = subprocess.run(command, env=env).returncode
    else:
        from harnessrl.cli import app

        try:
            code = app(list(args), prog_name="harnessrl", standalone_mode=False)
        except SystemExit as e:
            code = e.code
        except click.ClickException as e:
            e.show()
            code = e.exit_code
    if code not in (None, 0):
        raise SystemExit(
            f"stopped: `harnessrl {args[0]}` exited {code} (its message is above); run this again to resume"
        )


def _resume(folder: Path) -> list[str]:
    return ["--resume"] if (folder / "config.json").is_file() else []


def harness_name(text: str) -> str:
    from harnessrl.harness.registry import load_harness

    return load_harness(text).name


# ------------------------------------------------------------------------------------- the choice


def survey_table(rows: list[dict[str, Any]], k: int) -> dict[str, dict[str, Any]]:
    """Harness -> mean score, pass@k, pass^k and signal (pass@k - pass^k) over its tasks."""
    table = {}
    for h in dict.fromkeys(r["harness"] for r in rows):
        values = {m: task_values(rows, [h], m.replace("k", str(k)) if m != "mean" else m) for m in METRICS}
        means = {m: (sum(v.values()) / len(v) if v else 0.0) for m, v in values.items()}
        table[h] = {
            "tasks": len(values["mean"]),
            "mean": means["mean"],
            "pass@k": means["pass@k"],
            "pass^k": means["pass^k"],
            "signal": means["pass@k"] - means["pass^k"],
        }
    return table


def choose_harnesses(table: dict[str, dict[str, Any]], trained_count: int = 3) -> dict[str, Any]:
    """The survey's choice (RULE): trained harnesses, the held-out one and the reference arm's.
    Raises ValueError when the survey does not give two harnesses with signal and one flat."""
    order = sorted(table, key=lambda h: (-round(table[h]["signal"], 9), -round(table[h]["mean"], 9), h))
    signal = [h for h in order if table[h]["signal"] > 1e-9]
    flat = sorted((h for h in order if h not in signal), key=lambda h: (-round(table[h]["mean"], 9), h))
    if len(signal) < 2 or not flat:
        raise ValueError(
            f"the survey gives {len(signal)} harness(es) with signal ({', '.join(signal) or 'none'}) and "
            f"{len(flat)} flat ({', '.join(flat) or 'none'}); the rule needs two with signal and one flat: "
            "survey other candidates (--candidates) or name them (--trained, --held-out)"
        )
    if trained_count < 2:
        raise ValueError(f"--trained-count must be at least 2, got {trained_count}")
    held_out = signal[1]
    trained = [signal[0], flat[0], *signal[2:], *flat[1:]][:trained_count]
    return {
        "rule": RULE,
        "given": False,
        "trained": trained,
        "held_out": held_out,
        "reference": signal[0],
        "signal": signal,
        "flat": flat,
    }


# ------------------------------------------------------------------------------------- the stages


class Experiment:
    """The run folder OUT, the stages' markers and the records."""

    def __init__(self, args: argparse.Namespace, command: str):
        self.args = args
        self.command = command  # what run.json records
        self.out = Path(args.out)
        self.ws = Path(args.ws)
        self.model = f"hf:{self.ws / 'sft' / 'adapter'}" if args.model == "warm-start" else args.model
        self.seeds = [int(s) for s in args.seeds.split(",")]
        name = args.name or self.out.resolve().name
        self.record_dirs = [self.out / "records"]
        if args.records:
            self.record_dirs.append(Path(args.records_dir or RECORDS_DIR) / "bandit_gain" / name)

    # markers ------------------------------------------------------------------------------------
    def marker(self, stage: str) -> Path:
        return self.out / "done" / f"{stage}.json"

    def done(self, stage: str) -> bool:
        return self.marker(stage).is_file()

    def mark(self, stage: str, seconds: float, **facts: Any) -> None:
        when = dt.datetime.now(dt.timezone.utc).date().isoformat()
        write_json(self.marker(stage), {"stage": stage, "date": when, "seconds": round(seconds, 1), **facts})

    # records ------------------------------------------------------------------------------------
    def write_records(self, file: str, rows: list[dict[str, Any]]) -> None:
        for folder in self.record_dirs:
            write_lines(folder / file, rows)

    def choice(self) -> dict[str, Any]:
        path = self.out / "choice.json"
        if not path.is_file():
            raise SystemExit(f"{path} is missing: the survey stage has not finished")
        return json.loads(path.read_text(encoding="utf-8"))

    def write_run(self) -> None:
        """run.json of the records: the options, the choice, the evaluations and comparisons done."""
        if not (self.out / "choice.json").is_file():
            return
        a = self.args
        choice = self.choice()
        records = self.out / "records"
        evaluations = [n for n in self.evaluation_names() if (records / f"eval-{n}.jsonl").is_file()]
        run = {
            "experiment": "bandit_gain",
            "command": self.command,
            "model": self.model,
            "suite": a.suite,
            "budget": {k: getattr(a, k) for k in ("steps", "tasks_per_step", "group_size", "lr", "temperature")},
            "seeds": self.seeds,
            "test": f"{a.test_tasks} test tasks x {a.attempts} attempts, T={a.temperature}",
            "attempts": a.attempts,
            "harnesses": {k: choice[k] for k in ("trained", "held_out", "reference", "specs")},
            "survey": {"tasks": a.survey_tasks, "attempts": a.survey_attempts, "table": choice["table"]},
            "choice": {k: v for k, v in choice.items() if k not in ("specs", "table")},
            "evaluations": evaluations,
            "arms": [n for n in self.arm_names() if (records / f"train-{n}.jsonl").is_file()],
            "comparisons": [c for c in self.comparisons() if all(s in evaluations for s in "+".join(c[1:]).split("+"))],
            "stages": {s: json.loads(self.marker(s).read_text(encoding="utf-8")) for s in STAGES if self.done(s)},
        }
        for folder in self.record_dirs:
            write_json(folder / "run.json", run)

    def arm_names(self) -> list[str]:
        return [f"{arm}-s{seed}" for seed in self.seeds for arm in ARMS] + [f"reference-s{self.seeds[0]}"]

    def evaluation_names(self) -> list[str]:
        return ["start", *self.arm_names()]

    def comparisons(self) -> list[list[str]]:
        """[label, A, B] for B - A; "+" pools evaluations (the seeds) task by task."""
        s0, s1 = self.seeds
        both = lambda arm: f"{arm}-s{s0}+{arm}-s{s1}"  # noqa: E731
        return [
            [f"bandit - mixed, seed {s0}", f"mixed-s{s0}", f"bandit-s{s0}"],
            [f"bandit - mixed, seed {s1}", f"mixed-s{s1}", f"bandit-s{s1}"],
            ["bandit - mixed, both seeds", both("mixed"), both("bandit")],
            [f"bandit - start, seed {s0}", "start", f"bandit-s{s0}"],
            [f"mixed - start, seed {s0}", "start", f"mixed-s{s0}"],
            ["bandit - start, both seeds", "start", both("bandit")],
            ["mixed - start, both seeds", "start", both("mixed")],
            [f"reference - start, seed {s0}", "start", f"reference-s{s0}"],
            [f"bandit - reference, seed {s0}", f"reference-s{s0}", f"bandit-s{s0}"],
        ]

    # units --------------------------------------------------------------------------------------
    def evaluate(self, name: str, model: str, harnesses: list[str], *, split: str, tasks: int, attempts: int) -> Path:
        a = self.args
        folder = self.out / ("survey" if name == "survey" else f"eval/{name}")
        if not (folder / "summary.json").is_file():
            harnessrl(
                "eval", "--suite", a.suite, "--split", split, "--harness", ",".join(harnesses), "--model", model,
                "--tasks", str(tasks), "--attempts", str(attempts), "--temperature", str(a.temperature),
                "--seed", str(a.eval_seed), "--no-progress", "--out", str(folder), *_resume(folder),
            )  # fmt: skip
        self.write_records("survey.jsonl" if name == "survey" else f"eval-{name}.jsonl", eval_rows(folder))
        return folder

    def evaluate_test(self, name: str, model: str) -> None:
        choice = self.choice()
        specs = [choice["specs"][h] for h in [*choice["trained"], choice["held_out"]]]
        self.evaluate(name, model, specs, split="test", tasks=self.args.test_tasks, attempts=self.args.attempts)
        self.write_run()

    def train(self, arm: str, scheduler: str, harnesses: list[str], seed: int) -> None:
        """One arm, one step per command; the scheduler's state after each step is kept."""
        a = self.args
        folder = self.out / arm
        states_path = self.out / "states" / f"{arm}.jsonl"
        finished = self.out / "states" / f"{arm}.done"
        if not finished.is_file():
            states = {r["step"]: r for r in read_lines(states_path)}

            def command(steps: int) -> None:
                harnessrl(
                    "train", "grpo", "--model", self.model, "--suite", a.suite, "--harnesses", ",".join(harnesses),
                    "--scheduler", scheduler, "--steps", str(steps), "--tasks-per-step", str(a.tasks_per_step),
                    "--group-size", str(a.group_size), "--lr", str(a.lr), "--temperature", str(a.temperature),
                    "--seed", str(seed), "--checkpoint-every", "1", "--no-progress", "--out", str(folder),
                    *_resume(folder),
                )  # fmt: skip

            def keep_state() -> int:
                at, state = checkpoint_state(folder)
                if at:
                    states[at] = {"step": at, **state}
                write_lines(states_path, [states[s] for s in sorted(states) if s <= at])
                return at

            at = keep_state()
            if at >= a.steps:  # stopped after the last checkpoint: the adapter may be an older step's
                command(a.steps)
            while at < a.steps:
                command(at + 1)
                after = keep_state()
                if after <= at:
                    raise SystemExit(f"stopped: {folder} did not advance past step {at}")
                at = after
            finished.write_text("", encoding="utf-8")
        states = {r["step"]: r for r in read_lines(states_path)}
        self.write_records(f"train-{arm}.jsonl", train_rows(folder, states))

    def train_arm(self, arm: str, seed: int) -> None:
        choice = self.choice()
        if arm == "reference":
            specs, scheduler = [choice["specs"][choice["reference"]]], f"single:{choice['reference']}"
        else:
            specs, scheduler = [choice["specs"][h] for h in choice["trained"]], ARMS[arm]
        self.train(f"{arm}-s{seed}", scheduler, specs, seed)
        self.write_run()

    def adapter(self, arm: str) -> str:
        return f"hf:{self.out / arm / 'adapter'}"


# Options that change nothing a stage computes: a rerun may give others.
FREE_OPTIONS = ("until", "records", "records_dir", "name")


def check_options(path: Path, args: argparse.Namespace) -> None:
    """OUT/options.json: the first run's options; a rerun with others that change what the
    stages compute is refused (the finished stages were computed with the first ones)."""
    options = {k: v for k, v in vars(args).items() if k not in FREE_OPTIONS}
    if not path.is_file():
        write_json(path, options)
        return
    first = json.loads(path.read_text(encoding="utf-8"))
    changed = [f"--{k.replace('_', '-')} {first.get(k)!r} -> {v!r}" for k, v in options.items() if first.get(k) != v]
    if changed:
        raise SystemExit(
            f"{path.parent} was run with other options ({'; '.join(changed)}): give the same, or another --out"
        )


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def checkpoint_state(folder: Path) -> tuple[int, dict[str, Any]]:
    """The step of a training folder's checkpoint (0 without one) and its scheduler's estimates."""
    path = folder / "checkpoint" / "state.json"
    if not path.is_file():
        return 0, {}
    state = json.loads(path.read_text(encoding="utf-8"))
    scheduler = state["scheduler"]
    return int(state["step"]), {k: scheduler[k] for k in ("score", "count", "total") if k in scheduler}


def stage_warm_start(exp: Experiment) -> dict[str, Any]:
    a = exp.args
    adapter = exp.ws / "sft" / "adapter"
    if a.model != "warm-start":
        return {"skipped": f"--model {a.model} is not the warm start"}
    if adapter.is_dir():  # train sft writes it last
        return {"skipped": f"{adapter} exists"}
    oracle = exp.ws / "oracle"
    if not (oracle / "summary.json").is_file():
        harnessrl(
            "eval", "--suite", a.suite, "--split", "train", "--harness", ",".join(WARM_START_HARNESSES),
            "--model", "oracle", "--tasks", str(a.ws_tasks), "--attempts", "1", "--no-progress",
            "--out", str(oracle), *_resume(oracle),
        )  # fmt: skip
    sft = exp.ws / "sft"
    harnessrl(
        "train", "sft", "--from", str(oracle), "--as-harness", "own", "--model", a.base_model,
        "--epochs", str(a.ws_epochs), "--lr", str(a.ws_lr), "--batch-size", "8", "--pack", "--no-progress",
        "--out", str(sft), *_resume(sft),
    )  # fmt: skip
    return {}


def stage_survey(exp: Experiment) -> dict[str, Any]:
    a = exp.args
    candidates = (a.candidates or default_candidates()).split(",")
    specs = {harness_name(c): c for c in candidates if c}
    folder = exp.evaluate(
        "survey", exp.model, list(specs.values()), split="dev", tasks=a.survey_tasks, attempts=a.survey_attempts
    )
    table = survey_table(eval_rows(folder), a.survey_attempts)
    if a.trained is not None:
        given = {harness_name(t): t for t in a.trained.split(",") if t}
        held_out = harness_name(a.held_out)
        if len(given) < 2 or held_out in given:
            raise SystemExit("--trained needs two harnesses or more, and --held-out one that is not among them")
        specs |= given | {held_out: a.held_out}
        choice = {"rule": "given (--trained, --held-out)", "given": True, "trained": list(given)}
        choice |= {"held_out": held_out, "reference": next(iter(given))}
    else:
        try:
            choice = choose_harnesses(table, a.trained_count)
        except ValueError as e:
            print_survey(table, a.survey_attempts)
            raise SystemExit(f"stopped: {e}") from None
    choice["specs"] = {h: specs[h] for h in [*choice["trained"], choice["held_out"]]}
    choice["table"] = table
    write_json(exp.out / "choice.json", choice)
    print_survey(table, a.survey_attempts)
    print(f"trained: {', '.join(choice['trained'])}; held out: {choice['held_out']}; reference: {choice['reference']}")
    return {"trained": choice["trained"], "held_out": choice["held_out"]}


def stage_arms(exp: Experiment, seed: int) -> dict[str, Any]:
    for arm in ARMS:
        exp.train_arm(arm, seed)
    return {}


def stage_evaluation(exp: Experiment) -> dict[str, Any]:
    exp.evaluate_test("start", exp.model)
    for arm in ARMS:
        exp.evaluate_test(f"{arm}-s{exp.seeds[0]}", exp.adapter(f"{arm}-s{exp.seeds[0]}"))
    return {}


def stage_second_seed(exp: Experiment) -> dict[str, Any]:
    seed = exp.seeds[1]
    stage_arms(exp, seed)
    for arm in ARMS:
        exp.evaluate_test(f"{arm}-s{seed}", exp.adapter(f"{arm}-s{seed}"))
    return {}


def stage_reference(exp: Experiment) -> dict[str, Any]:
    seed = exp.seeds[0]
    exp.train_arm("reference", seed)
    exp.evaluate_test(f"reference-s{seed}", exp.adapter(f"reference-s{seed}"))
    return {}


# ------------------------------------------------------------------------------------- the report


def print_survey(table: dict[str, dict[str, Any]], k: int) -> None:
    print(f"\nsurvey ({k} attempts per task)   mean   pass@{k}  pass^{k}  signal")
    for h, r in table.items():
        print(f"  {h:<28} {r['mean']:.3f}  {r['pass@k']:.3f}   {r['pass^k']:.3f}   {r['signal']:.3f}")


def report(exp: Experiment) -> dict[str, Any]:
    """The differences and levels of what has been evaluated, from OUT/records."""
    records = exp.out / "records"
    if not (records / "run.json").is_file():
        return {}
    run = json.loads((records / "run.json").read_text(encoding="utf-8"))
    k = run["attempts"]
    columns = [*run["harnesses"]["trained"], "trained", "held-out"]
    result: dict[str, Any] = {"harnesses": run["harnesses"], "levels": {}, "differences": {}}
    for metric in METRICS:
        m = metric.replace("k", str(k)) if metric != "mean" else metric
        print(f"\n{m} per task, {run['test']} ({', '.join(columns)})")
        for name in run["evaluations"]:
            cells = {h: records_level(records, name, h, m) for h in columns}
            result["levels"].setdefault(m, {})[name] = cells
            print(f"  {name:<34} " + "  ".join(cells.values()))
        for label, a, b in run["comparisons"]:
            diffs = {h: records_difference(records, a, b, h, m).model_dump() for h in columns}
            result["differences"].setdefault(m, {})[label] = diffs
            print(f"  {label:<34} " + "  ".join(interval_text(d) for d in diffs.values()))
    for arm in run["arms"]:
        rows = read_lines(records / f"train-{arm}.jsonl")
        steps = [f"{r['harness']} {r['signal_groups']}/{r['groups']}" for r in rows]
        print(f"  {arm}: chosen harness and groups with signal per step: " + "; ".join(steps))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    if "--until" in given:  # the records are the whole run's
        del given[given.index("--until") : given.index("--until") + 2]
    exp = Experiment(args, " ".join([".venv/bin/python bench/bandit_gain.py", *map(shlex.quote, given)]))
    exp.out.mkdir(parents=True, exist_ok=True)
    check_options(exp.out / "options.json", args)
    stages = {
        "warm-start": lambda: stage_warm_start(exp),
        "survey": lambda: stage_survey(exp),
        "arms": lambda: stage_arms(exp, exp.seeds[0]),
        "evaluation": lambda: stage_evaluation(exp),
        "second-seed": lambda: stage_second_seed(exp),
        "reference": lambda: stage_reference(exp),
    }
    for stage in STAGES:
        if exp.done(stage):
            print(f"stage {stage}: done ({exp.marker(stage)})", flush=True)
        else:
            print(f"stage {stage}", flush=True)
            started = time.perf_counter()
            facts = stages[stage]()
            exp.write_run()
            exp.mark(stage, time.perf_counter() - started, **facts)
            exp.write_run()  # with the marker's date and seconds
        if stage == args.until:
            break
    result = {"args": vars(args), "stages": [s for s in STAGES if exp.done(s)], **report(exp)}
    print("BANDIT_GAIN_JSON " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
