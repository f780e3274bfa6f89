"""The job kernel (harnessrl.kernel, harnessrl.jobs.entries): every command enters through it,
one resume rule for every job, its models chosen once, one error type reaching the command line."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import harnessrl
from harnessrl import kernel
from harnessrl.cli import app
from harnessrl.errors import JobError, JobFailed
from harnessrl.jobs import entries

SRC = Path(harnessrl.__file__).parent

# each command's words, and the extra options it needs to get past its own option parsing
COMMANDS = {
    "eval": ["eval"],
    "evolve": ["evolve"],
    "study": ["study"],
    "improve": ["improve"],
    "train grpo": ["train", "grpo"],
    "train sft": ["train", "sft", "--from", "runs/earlier"],  # --from or --sample: SFTConfig.refusal
    "train distill": ["train", "distill", "--teacher-harness", "react", "--student-harness", "react"],
}


def _called_names(fn) -> set[str]:
    tree = ast.parse(Path(fn.__code__.co_filename).read_text(encoding="utf-8"))
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn.__name__]
    out = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        f = call.func
        out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def test_every_command_has_an_entry_and_every_entry_builds_its_context_in_the_kernel():
    assert set(entries.ENTRIES) == set(COMMANDS)
    for name, entry in entries.ENTRIES.items():
        assert "_context" in _called_names(entry), f"{name}: its entry does not enter the kernel"
    assert "enter" in _called_names(entries._context)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_reaches_its_job_through_the_kernel(command, tmp_path, monkeypatch):
    """The command line calls the entry, the entry the kernel: a spy on `enter` sees the job, and
    its JobError is the command's one-line error with exit 2."""
    seen = []

    def spy(job, config, out, **kw):
        seen.append((job, Path(out)))
        raise JobError("stopped at the kernel by the test")

    monkeypatch.setattr(entries, "enter", spy)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, [*COMMANDS[command], "--out", str(out)])
    assert seen == [(command, out)], r.output
    assert r.exit_code == 2 and "stopped at the kernel by the test" in r.output
    assert "Traceback" not in r.output


def test_the_cli_calls_no_job_but_through_its_entry():
    """The job functions and classes are called from jobs/entries.py alone among the commands."""
    jobs = {"run_eval", "run_evolve", "run_study", "run_improve", "run_sft", "Trainer", "DistillRun"}
    for path in sorted((SRC / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        called = {
            n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        assert not called & jobs, (
            f"{path.name} calls {sorted(called & jobs)} directly, not through harnessrl.jobs.entries"
        )


# where a model spec may be parsed, and a device or dtype resolved (preflight reads a model's
# tokenizer and context through models/prompt_model.py)
MODEL_CHOICE_HOMES = ("models/", "kernel.py")


def test_the_model_is_chosen_only_in_models_and_the_kernel():
    resolving = {"resolve_device", "resolve_dtype"}
    parsing = {"parse", "parse_local"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(MODEL_CHOICE_HOMES):
            continue
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            on_spec = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "ModelSpec"
            if name in resolving or (on_spec and name in parsing):
                found.append(f"{rel}:{n.lineno} {name}")
    assert not found, f"a model chosen outside models/ and the kernel: {found}"


def test_every_job_error_is_a_job_error():
    from harnessrl.evolve.loop import EvolveError
    from harnessrl.executors import ExecutorError
    from harnessrl.improve.config import ImproveError
    from harnessrl.jobs.evaluate import EvalError
    from harnessrl.jobs.stages import StageError
    from harnessrl.jobs.study import StudyError
    from harnessrl.preflight import PreflightRefused
    from harnessrl.rundir import RunFolderError
    from harnessrl.train.distill import DistillError
    from harnessrl.train.sft_data import SFTError
    from harnessrl.train.trainer import TrainError
    from harnessrl.train.update import TrainingDiverged

    for error in (
        EvalError,
        EvolveError,
        StudyError,
        StageError,
        ImproveError,
        TrainError,
        SFTError,
        DistillError,
        RunFolderError,
        ExecutorError,
        PreflightRefused,
    ):
        assert issubclass(error, JobError) and error("x").exit_code == 2, error
    assert issubclass(TrainingDiverged, JobFailed) and TrainingDiverged("nan").exit_code == 1
    assert issubclass(TrainingDiverged, RuntimeError)  # as before, for callers that caught it so


def test_a_job_failure_exits_1_and_a_job_error_2_in_one_line(tmp_path, monkeypatch):
    from harnessrl.train.update import TrainingDiverged

    def diverges(*a, **kw):
        raise TrainingDiverged("the loss became nan at step 3")

    monkeypatch.setattr(entries, "enter", diverges)
    r = CliRunner().invoke(app, ["train", "grpo", "--out", str(tmp_path / "run")])
    assert r.exit_code == 1 and "error: the loss became nan at step 3" in r.output


# -- the resume rule ---------------------------------------------------------------------------------


def _started(out: Path, job: str, config) -> None:
    """A run folder as a job that started with `config` leaves it (its options, a config.json)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{}")
    kernel.record_options(job, config, out)


def stop_after_the_kernel(monkeypatch) -> list:
    """Every entry stops (a JobError) right after its kernel context is built; returns the list
    each context's config is appended to."""
    configs = []
    real_enter = kernel.enter

    def enter_then_stop(*a, **kw):
        with real_enter(*a, **kw) as ctx:
            configs.append(ctx.config)
        raise JobError("stopped after the kernel by the test")

    monkeypatch.setattr(entries, "enter", enter_then_stop)
    return configs


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_resume_fills_in_the_options_left_out_and_uses_those_given_for_every_job(command, tmp_path, monkeypatch):
    """The same rule for every command: `--resume` alone continues with the recorded options
    (a --seed 7 run resumes with seed 7); a given option is used, and said, for the job's run
    folder to accept or refuse."""
    configs = stop_after_the_kernel(monkeypatch)
    out = tmp_path / "run"
    words = [*COMMANDS[command], "--out", str(out), "--seed", "7"]
    r = CliRunner().invoke(app, words)  # a fresh start: refused by the test after the kernel
    assert r.exit_code == 2 and configs[-1].seed == 7, r.output
    _started(out, command, configs[-1])
    r = CliRunner().invoke(app, [*COMMANDS[command], "--out", str(out), "--resume"])
    assert r.exit_code == 2 and configs[-1].seed == 7, r.output  # left out: the recorded value
    r = CliRunner().invoke(app, [*COMMANDS[command], "--out", str(out), "--resume", "--seed", "8"])
    assert configs[-1].seed == 8 and "--seed changed: 7 -> 8" in r.output


def test_options_that_refuse_each_other_are_judged_after_the_resume_rule(tmp_path, monkeypatch):
    """`--eval-harnesses` needs `--eval-every`: refused on a fresh start, before any model is
    chosen; on `--resume` the recorded --eval-every fills in the one left out, and it runs."""
    chosen = []
    monkeypatch.setattr(kernel, "choose_models", lambda requests: chosen.append(list(requests)) or {})
    configs = stop_after_the_kernel(monkeypatch)
    out = tmp_path / "run"
    grpo = ["train", "grpo", "--out", str(out)]
    r = CliRunner().invoke(app, [*grpo, "--eval-harnesses", "react"])
    assert r.exit_code == 2 and "--eval-harnesses needs --eval-every N" in r.output, r.output
    assert not configs and not chosen  # refused before the models
    r = CliRunner().invoke(app, [*grpo, "--eval-harnesses", "react", "--eval-every", "2"])
    assert r.exit_code == 2 and "stopped after the kernel" in r.output, r.output
    _started(out, "train grpo", configs[-1])
    r = CliRunner().invoke(app, [*grpo, "--resume", "--eval-harnesses", "react"])
    assert "stopped after the kernel" in r.output, r.output
    assert (configs[-1].eval_every, configs[-1].eval_harnesses) == (2, ["react"])
    # evolve: --proposer llm needs --proposer-model, which a resumed run has recorded
    out = tmp_path / "evolve"
    evolve = ["evolve", "--out", str(out)]
    r = CliRunner().invoke(app, [*evolve, "--proposer", "llm"])
    assert r.exit_code == 2 and "--proposer llm needs --proposer-model" in r.output, r.output
    r = CliRunner().invoke(app, [*evolve, "--proposer", "llm", "--proposer-model", "openai:m@http://127.0.0.1:9/v1"])
    assert "stopped after the kernel" in r.output, r.output
    _started(out, "evolve", configs[-1])
    r = CliRunner().invoke(app, [*evolve, "--resume", "--proposer", "llm"])
    assert "stopped after the kernel" in r.output and configs[-1].proposer_model.startswith("openai:m@"), r.output


def test_a_library_caller_resuming_passes_its_whole_config(tmp_path):
    from harnessrl.config import EvalConfig

    _started(tmp_path, "eval", EvalConfig(seed=7))
    with kernel.enter("eval", EvalConfig(), tmp_path, resume=True) as ctx:  # given=None: taken whole
        assert ctx.config.seed == 0


def test_options_are_kept_only_for_a_job_that_ran(tmp_path):
    from harnessrl.config import EvalConfig

    _started(tmp_path, "eval", EvalConfig(seed=7))
    before = (tmp_path / kernel.OPTIONS).read_text()
    with pytest.raises(JobError):  # a refused resume leaves the recorded options as they were
        with kernel.enter("eval", EvalConfig(seed=9), tmp_path, resume=True, given={"seed"}):
            raise JobError("refused")
    assert (tmp_path / kernel.OPTIONS).read_text() == before
    with pytest.raises(KeyboardInterrupt):  # an interrupted run keeps them (a resume continues it)
        with kernel.enter("eval", EvalConfig(seed=9), tmp_path, resume=True, given={"seed"}):
            raise KeyboardInterrupt
    assert json.loads((tmp_path / kernel.OPTIONS).read_text())["options"]["seed"] == 9
    fresh = tmp_path / "fresh"
    with pytest.raises(JobError):  # refused before it started: nothing written
        with kernel.enter("eval", EvalConfig(), fresh, resume=False):
            raise JobError("no tasks selected")
    assert not fresh.exists()


def test_every_job_config_is_one_kind_of_record_and_a_changed_copy_is_validated_again():
    """The configs of all seven commands are Options models (one way to read, dump and change
    them); `replace` checks the changed copy as the command line would, where pydantic's
    model_copy would take any value."""
    from pydantic import ValidationError

    from harnessrl.cli import common, eval, evolve, improve, study, train
    from harnessrl.config import Options
    from harnessrl.train.config import TrainConfig

    commands = [eval.eval_cmd, evolve.evolve_cmd, study.study_cmd, improve.improve_cmd]
    commands += [train.grpo_cmd, train.sft_cmd, train.distill_cmd]
    configs = [model for command in commands for model in command.__wrapped_config__]
    assert len(configs) == 2 * len(COMMANDS) and all(issubclass(m, Options) for m in configs), configs
    base = TrainConfig(steps=3)
    changed = base.replace(lr=2e-4, harnesses="react,json-tools")  # validated: the comma list is split
    assert (changed.steps, changed.lr, changed.harnesses) == (3, 2e-4, ["react", "json-tools"])
    assert base.lr == 1e-4  # the original is untouched
    with pytest.raises(ValidationError, match="lr"):
        base.replace(lr=-1.0)
    with pytest.raises(ValidationError, match="not_an_option"):
        base.replace(not_an_option=1)
    assert common.config_fields(TrainConfig).keys() == TrainConfig.model_fields.keys()


def test_a_broken_options_file_is_a_job_error(tmp_path):
    from harnessrl.config import EvalConfig

    (tmp_path / kernel.OPTIONS).write_text("{not json")
    with pytest.raises(JobError, match="options.json is not valid JSON"):
        kernel.enter("eval", EvalConfig(), tmp_path, resume=True, given=set())


def test_the_models_are_chosen_once_with_the_option_named(tmp_path):
    from harnessrl.config import EvalConfig

    with kernel.enter(
        "eval",
        EvalConfig(model="tiny-random", judge_model="tiny-random"),
        tmp_path,
        resume=False,
        models=kernel.config_models,
    ) as ctx:
        model = ctx.model()
        assert model.local and str(model.device) == "cpu" and model.dtype == "float32"
        assert ctx.model("--judge-model").text == "tiny-random"
    with pytest.raises(JobError, match="--device cpu applies to local models"):
        kernel.enter(
            "eval",
            EvalConfig(model="openai:m@http://127.0.0.1:9/v1", device="cpu"),
            tmp_path,
            resume=False,
            models=kernel.config_models,
        )
    with pytest.raises(JobError, match="--collect-model: unknown model 'nope'"):
        kernel.choose_models([kernel.ModelRequest("--collect-model", "nope")])


def _job_configs() -> dict[str, type]:
    from harnessrl.cli import eval, evolve, improve, study, train

    commands = {"eval": eval.eval_cmd, "evolve": evolve.evolve_cmd, "study": study.study_cmd}
    commands |= {"improve": improve.improve_cmd, "train grpo": train.grpo_cmd}
    commands |= {"train sft": train.sft_cmd, "train distill": train.distill_cmd}
    return {job: command.__wrapped_config__[0] for job, command in commands.items()}


BAD_VALUES = {"suite": "no-such-suite", "harness": "no-such-harness", "harnesses": ["no-such-harness"]}


@pytest.mark.parametrize("job", sorted(COMMANDS))
def test_every_option_naming_a_suite_harness_or_tasks_is_read_by_the_kernel_and_refused_by_name(job, tmp_path):
    """Each option a job config marks (harnessrl.config.Reads) is read in `enter`: a value that
    cannot be read is a JobError whose line starts with that option, before the job runs."""
    from harnessrl.config import Reads, option_name

    config_class = _job_configs()[job]
    base = {"model": "tiny-random"}
    if job == "train distill":
        base |= {"teacher_harness": "react", "student_harness": "react"}
    if job == "train sft":
        base |= {"from_runs": ["runs/earlier"]}
    marks = {n: m for n, f in config_class.model_fields.items() for m in f.metadata if isinstance(m, Reads)}
    for name, mark in marks.items():
        changes = dict(base)
        if mark.when is not None:
            changes[mark.when] = 1 if mark.when == "eval_every" else ["react"]
        changes[name] = BAD_VALUES.get(mark.kind, 10**6)
        with pytest.raises(JobError) as refused:
            kernel.enter(job, config_class(**changes), tmp_path / "never")
        assert str(refused.value).startswith(option_name(name)), (name, str(refused.value))
    assert not (tmp_path / "never").exists()
    if job != "train sft":  # its harness comes from the episodes it learns from (train/sft.py)
        assert marks, f"{job}: no option marked for the kernel to read"


def test_the_context_holds_what_the_options_name_and_objects_given_in_their_place(tmp_path):
    from harnessrl.config import EvalConfig
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import parse_spec
    from harnessrl.improve import ImproveConfig
    from harnessrl.train.config import TrainConfig

    config = ImproveConfig(model="tiny-random", dev_tasks=2, test_tasks=3, content_tasks=4, evolved="json-tools")
    inputs = kernel.enter("improve", config, tmp_path / "i").inputs
    assert [len(inputs.tasks[f]) for f in ("dev_tasks", "test_tasks", "content_tasks")] == [2, 3, 4]
    assert {t.split for t in inputs.tasks["test_tasks"]} == {"test"} and inputs.suite.name == "toolcalc"
    assert (inputs.harness["seed_harness"].name, inputs.harness["evolved"].name) == ("react", "json-tools")
    # a spec built by the caller stands in for a name: recorded by its name, read as given
    spec = load_harness("react").model_copy(update={"name": "react-short"})
    ctx = kernel.enter("train grpo", TrainConfig(model="tiny-random"), tmp_path / "t", objects={"harnesses": [spec]})
    assert ctx.config.harnesses == ["react-short"] and ctx.inputs.harnesses["harnesses"] == [spec]
    assert "eval_harnesses" not in ctx.inputs.harnesses  # none held out: nothing read
    # a split another option names: a split the suite lacks is that option's fault
    with pytest.raises(JobError, match="^--split: unknown split 'nope'"):
        kernel.enter("eval", EvalConfig(model="tiny-random", split="nope"), tmp_path / "e")
    with pytest.raises(JobError, match="^--tasks: split 'dev' of suite 'toolcalc' has 48 tasks; asked for 99"):
        kernel.enter("eval", EvalConfig(model="tiny-random", suite="toolcalc", tasks=99), tmp_path / "e")
    # an agent program given where the job needs harnessrl's own loop is still refused, by option
    external = parse_spec({"name": "ext", "kind": "external", "command": ["true"]}, "test")
    with pytest.raises(JobError, match="^--seed-harness: .*external agent program"):
        kernel.enter("improve", config, tmp_path / "x", objects={"seed_harness": external})


def test_the_preflight_refuses_an_agent_without_a_first_request_and_the_jobs_say_nothing_was_measured(tmp_path):
    """Through the kernel, as a library caller meets them: the preflight's refusal is the job's own
    error (exit 2) before anything ran; a job that fails once every episode it ran was an
    infrastructure error is NothingMeasured (exit 3), its own error named; one that measured
    something, or failed before any episode, keeps its own error."""
    import time

    from harnessrl.config import EvalConfig
    from harnessrl.harness.spec import parse_spec
    from harnessrl.jobs.evaluate import EvalError
    from harnessrl.jobs.measured import NothingMeasured, measuring
    from harnessrl.store import RunStore
    from harnessrl.types import Termination, Trajectory

    missing = parse_spec({"name": "missing", "kind": "external", "command": ["no-such-agent-program-xyz"]}, "test")
    config = EvalConfig(model="tiny-random", suite="workspace", tasks=1, harness=["missing"])
    with pytest.raises(EvalError, match="harness missing: no first request measured") as refused:
        kernel.enter("eval", config, tmp_path / "e", objects={"harness": [missing]}, preflight=True, error=EvalError)
    assert refused.value.exit_code == 2 and not (tmp_path / "e").exists()

    def episode(n: int, infra: bool) -> Trajectory:
        return Trajectory(
            episode_id=f"ep-{n}", task_id=f"t/{n}", suite="t", family="f", split="dev", harness="h", attempt=0,
            instruction="x", started_at=time.time(), termination=Termination.error if infra else Termination.exited,
            termination_detail="infrastructure error" if infra else "", infra_error="backend down" if infra else None,
        )  # fmt: skip

    out = tmp_path / "run"
    with pytest.raises(NothingMeasured, match=r"\(2\) was an infrastructure error.*the first: backend down.*"
                       r"\(evolve stopped: no scored task\)") as nothing:  # fmt: skip
        with measuring(out, "evolve"):
            with RunStore(out) as store:
                store.add(episode(1, True))
                store.add(episode(2, True))
            raise ValueError("no scored task")
    assert nothing.value.exit_code == 3 and isinstance(nothing.value.__cause__, ValueError)
    with pytest.raises(ValueError, match="^no scored task$"):  # one of its episodes was measured
        with measuring(out, "evolve"):
            with RunStore(out) as store:
                store.add(episode(3, False))
            raise ValueError("no scored task")
    earlier = tmp_path / "earlier"
    with RunStore(earlier) as store:
        store.add(episode(4, True))
    with pytest.raises(JobFailed):  # no episode ran meanwhile: the earlier failures are not this error's
        with measuring(earlier, "train grpo"):
            raise JobFailed("diverged")
