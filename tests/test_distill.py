"""On-policy distillation (`harnessrl train distill`) with the tiny random model: the loss against a
reverse KL computed by hand, the teacher's prompt, the KL falling on a fixed batch, the run folder,
exact resume and the refusals.

The student harness is react shrunk to one plain-text step of 8 tokens; the teacher is the same
harness with another system prompt (a shrunk stand-in for an evolved harness)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import typer
from helpers import shrunk
from test_trainer import TextScore, adapter_weights, lines
from typer.testing import CliRunner

from harnessrl.cli.train import train_app
from harnessrl.errors import JobError
from harnessrl.kernel import enter
from harnessrl.train.distill import (
    DistillConfig,
    DistillError,
    DistillRun,
    TeacherContext,
    distill_units,
    distill_update,
    reverse_kl_loss,
    step_tasks,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHORT = dict(max_steps=1, max_new_tokens=8, demonstrations=[], plain_text_answer=True)
STUDENT = shrunk("react", system_prompt="Reply with any text.", **SHORT)
TEACHER = shrunk("react", system_prompt="You are careful. Reply with one short sentence of plain text.", **SHORT)
BASE = DistillConfig(
    teacher_harness="teacher",
    student_harness="student",
    model="tiny-random",
    suite="textscore",
    steps=2,
    tasks_per_step=2,
    attempts=2,
    lora_r=4,
    lora_alpha=8,
    temperature=1.0,
    checkpoint_every=5,
    device="cpu",
)


def distiller(out, config=BASE, resume=False, teacher=TEACHER, student=STUDENT) -> DistillRun:
    objects = {"suite": TextScore(), "teacher_harness": teacher, "student_harness": student}
    ctx = enter("train distill", config, out, resume=resume, error=DistillError, objects=objects, progress=False)
    return DistillRun(ctx)


# ------------------------------------------------------------------------------------------ the loss


def test_the_loss_is_the_reverse_kl_computed_by_hand():
    # two positions over a vocabulary of 3: the student differs from the teacher at the first only
    p_s = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]])
    p_t = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]])
    logits = p_s.log().requires_grad_(True)  # the student's logits: log-softmax gives p_s back
    student = torch.log_softmax(logits, -1)
    # KL(s || t) at position 1 = 0.5 ln(0.5/0.2) + 0.3 ln(0.3/0.5) + 0.2 ln(0.2/0.3)
    by_hand = 0.5 * math.log(2.5) + 0.3 * math.log(0.6) + 0.2 * math.log(2 / 3)
    assert by_hand == pytest.approx(0.2238, abs=1e-4)
    loss, stats = reverse_kl_loss(student, p_t.log(), targets=torch.tensor([1, 0]))
    assert float(loss.detach()) == pytest.approx(by_hand / 2, abs=1e-6)  # the mean over the 2 positions
    assert stats["kl"] == pytest.approx(by_hand / 2, abs=1e-6) and stats["kl_max"] == pytest.approx(by_hand, abs=1e-6)
    # the sampled-token estimate: token 1 at position 1 (ln 0.3/0.5), token 0 at position 2 (0)
    assert stats["kl_sampled"] == pytest.approx(math.log(0.6) / 2, abs=1e-6)
    # a normalizer (the step's tokens, for accumulation) divides the sum instead
    assert float(reverse_kl_loss(student, p_t.log(), normalizer=4)[0].detach()) == pytest.approx(by_hand / 4, abs=1e-6)
    loss.backward()
    # where the two agree the KL is at its minimum: no gradient on the logits there; where they
    # differ, the gradient of KL / 2 on the logits is p_s * (log p_s/p_t - KL) / 2
    assert torch.allclose(logits.grad[1], torch.zeros(3), atol=1e-7)
    expected = p_s[0] * ((p_s[0] / p_t[0]).log() - by_hand) / 2
    assert torch.allclose(logits.grad[0], expected, atol=1e-6)


def test_the_loss_is_zero_exactly_when_the_distributions_agree_and_the_teacher_gets_no_gradient():
    logits = torch.randn(5, 11)
    teacher = torch.log_softmax(logits, -1).requires_grad_(True)
    same, _ = reverse_kl_loss(torch.log_softmax(logits, -1), teacher)
    assert abs(float(same)) < 1e-6
    other, _ = reverse_kl_loss(torch.log_softmax(torch.randn(5, 11, requires_grad=True), -1), teacher)
    assert float(other.detach()) > 0
    other.backward()
    assert teacher.grad is None  # the teacher is a constant of the loss
    with pytest.raises(ValueError, match="positions, vocabulary"):
        reverse_kl_loss(torch.zeros(2, 3), torch.zeros(2, 4))


# ------------------------------------------------------------------------------- the teacher's view


def test_the_teacher_reads_the_student_conversation_under_its_own_opening(tokenizer):
    from harnessrl.types import Message

    task = TextScore().tasks("train", 1)[0]
    context = TeacherContext(STUDENT, TEACHER, tokenizer, "user")
    opening, _ = context.opening(task, "student")
    tail = [Message(role="assistant", content="hello"), Message(role="user", content="go on")]
    ids = context.prompt_ids(task, [*opening, *tail])
    text = tokenizer.decode(ids)
    assert "You are careful." in text and "Reply with any text." not in text
    assert task.instruction in text and text.index("hello") < text.index("go on")
    # the same harness as teacher: exactly the student's own prompt, token for token
    same = TeacherContext(STUDENT, STUDENT, tokenizer, "user")
    from harnessrl.models import chat

    assert same.prompt_ids(task, [*opening, *tail]) == chat.render_prompt_ids(tokenizer, [*opening, *tail], "user")
    with pytest.raises(DistillError, match="does not start with the student harness's opening"):
        context.prompt_ids(task, [Message(role="system", content="x"), Message(role="user", content="other task")])


def test_tasks_of_a_step_depend_on_the_seed_and_step_only():
    tasks = TextScore().tasks("train")
    assert [t.id for t in step_tasks(tasks, 3, 0, 5)] == [t.id for t in step_tasks(list(tasks), 3, 0, 5)]
    assert len({t.id for t in step_tasks(tasks, 3, 0, 5)}) == 3
    assert [t.id for t in step_tasks(tasks, 3, 0, 5)] != [t.id for t in step_tasks(tasks, 3, 0, 6)]


# ------------------------------------------------------------------------------------------ the run


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("distill") / "full"
    distiller(out).run()
    return out


def test_a_run_writes_metrics_checkpoint_rollouts_and_a_loadable_adapter(full_run):
    from harnessrl.store import RunStore

    out = full_run
    records = lines(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["episodes"] == 4 and r["optimizer_step"] and r["units"] >= 4
        assert r["kl"] > 0 and math.isfinite(r["loss"]) and r["grad_norm"] > 0
        assert r["kl_max"] >= r["kl"] and r["teacher_prompt_tokens_mean"] != r["student_prompt_tokens_mean"]
    config = json.loads((out / "config.json").read_text())
    assert config["teacher_spec"]["system_prompt"].startswith("You are careful.")
    assert config["student_spec"]["system_prompt"] == "Reply with any text."
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 2
    meta = json.loads((out / "adapter" / "harnessrl.json").read_text())
    assert meta["trained_by"] == "harnessrl train distill" and meta["teacher_harness"] == "react"
    with RunStore(out / "rollouts") as store:
        assert store.count() == 8
    from harnessrl.models.hf import HFPolicy

    policy = HFPolicy.from_adapter(str(out / "adapter"))
    assert policy.name.startswith("hf:")


def test_the_kl_to_the_teacher_falls_on_a_fixed_batch(tmp_path):
    from harnessrl.rollout import Job

    run = distiller(tmp_path / "fixed", BASE.replace(lr=5e-3))
    run._setup()
    tasks = step_tasks(run.train_tasks, 2, 0, 0)
    trajectories = run.runner.run([Job(t, STUDENT, i) for t in tasks for i in range(2)])
    units = distill_units(trajectories, run.context, run.tasks_by_id)
    kls = [
        distill_update(
            run.peft_model,
            run.trainable,
            run.optimizer,
            units,
            pad_id=run.policy.pad_id,
            micro_batch=512,
            temperature=1.0,
            max_grad_norm=1.0,
        ).kl
        for _ in range(6)
    ]
    run.policy.close()
    assert kls[0] > 0 and kls[-1] < 0.85 * kls[0], kls
    assert all(b < a for a, b in zip(kls, kls[1:])), kls


def test_the_same_harness_as_teacher_starts_at_zero_kl(tmp_path):
    out = tmp_path / "same"
    distiller(out, BASE.replace(steps=1), teacher=STUDENT).run()
    (r,) = lines(out / "metrics.jsonl")
    # the teacher's prompt is the student's and LoRA starts at zero: the two distributions agree
    assert r["teacher_prompt_tokens_mean"] == r["student_prompt_tokens_mean"]
    assert abs(r["kl"]) < 1e-5 and r["kl_max"] < 1e-4 and r["grad_norm"] < 1e-4


def test_resume_equals_the_uninterrupted_run(full_run, tmp_path):
    out = tmp_path / "resumed"
    distiller(out, BASE.replace(steps=1)).run()
    distiller(out, resume=True).run()
    full, resumed = lines(full_run / "metrics.jsonl"), lines(out / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2]
    for a, b in zip(full, resumed):
        assert {k: v for k, v in a.items() if k != "time"} == {k: v for k, v in b.items() if k != "time"}
    for key, value in adapter_weights(full_run / "adapter").items():
        assert torch.equal(value, adapter_weights(out / "adapter")[key]), key
    # a resume with other options is refused, naming them (the run folder's JobError)
    with pytest.raises(JobError, match=r"different configuration.*lr \(0.0001 -> 1.0\)"):
        distiller(out, BASE.replace(lr=1.0), resume=True)


# ------------------------------------------------------------------------------------- bad input


def _cli():
    app = typer.Typer()
    app.add_typer(train_app, name="train")
    return app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--student-harness", "react"], "--teacher-harness is required"),
        (["--teacher-harness", "react", "--student-harness", "json-tools"], "must share their protocol"),
        (
            ["--teacher-harness", "react", "--student-harness", "react", "--rollout-server", "http://x/v1"],
            "--rollout-server is not supported",
        ),
        (["--teacher-harness", "no-such", "--student-harness", "react"], "--teacher-harness"),
        (
            ["--teacher-harness", "react", "--student-harness", "react", "--tasks-per-step", "100000"],
            "--tasks-per-step: split 'train' of suite 'toolcalc' has ",
        ),
        (
            ["--teacher-harness", "react", "--student-harness", "react", "--suite", "no-such-suite"],
            "no-such-suite",
        ),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(args, message, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(_cli(), ["train", "distill", "--model", "tiny-random", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert not out.exists()


def test_an_external_harness_is_refused(tmp_path):
    from harnessrl.harness.spec import parse_spec

    external = parse_spec({"name": "ext", "kind": "external", "command": ["true"]}, "test")
    with pytest.raises(DistillError, match="external agent program"):
        distiller(tmp_path / "out", student=external)
    assert not (tmp_path / "out").exists()


def test_the_command_distils_between_two_spec_files_and_resumes(tmp_path):
    import yaml

    paths = []
    for name, spec in (("teacher", TEACHER), ("student", STUDENT)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**spec.to_dict(), "name": name}))
        paths.append(str(path))
    out = tmp_path / "run"
    args = ["train", "distill", "--model", "tiny-random", "--device", "cpu", "--suite", "toolcalc", "--out", str(out)]
    args += ["--teacher-harness", paths[0], "--student-harness", paths[1], "--tasks-per-step", "1", "--attempts", "1"]
    args += ["--lora-r", "2", "--no-save-rollouts", "--no-progress"]
    r = CliRunner().invoke(_cli(), [*args, "--steps", "1"])
    assert r.exit_code == 0, r.output
    assert "distilled 1 steps" in r.output and "--harness" in r.output
    again = CliRunner().invoke(_cli(), [*args, "--steps", "2", "--resume"])
    assert again.exit_code == 0, again.output
    assert [x["step"] for x in lines(out / "metrics.jsonl")] == [1, 2]
    assert json.loads((out / "config.json").read_text())["teacher_harness"] == "teacher"
    assert not (out / "rollouts").exists()
