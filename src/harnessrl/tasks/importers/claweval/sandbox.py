"""What runs in the sandbox for Claw-Eval: the interpreter graders and services run on, the
folders they must read, and the scripts of the grader load check and the grading driver."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

from harnessrl.tasks.importers.common import (
    scratch_folder,
)

WORKSPACE = "/workspace"  # where Claw-Eval's sandbox container holds the task's files
GRADER_DIR = "/claweval/grader"
GRADER_MEMORY_MB = 4096


def read_only_paths(root: Path) -> list[Path]:
    """What a sandboxed grader or service must see even where the sandbox puts a fresh /tmp: the
    checkout, this Python's environment and its package folders."""
    return list(dict.fromkeys([root, Path(sys.prefix), *map(Path, package_folders())]))


def package_folders() -> list[str]:
    """This process's import folders beyond the standard library (site-packages, editable installs)."""
    stdlib = Path(sys.base_prefix).resolve() / "lib"
    out = []
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            real = Path(entry).resolve()
            if real != stdlib and not (stdlib in real.parents and "site-packages" not in real.parts):
                out.append(str(real))
    return list(dict.fromkeys(out))


@functools.cache
def grader_python() -> tuple[str, dict[str, str]]:
    """(interpreter, extra environment) for Claw-Eval graders and services, which import the
    framework's packages (pydantic, PyYAML, FastAPI...): this process's interpreter when the
    sandbox user can run it, else the same Python version on the sandbox's PATH with this
    process's package folders on PYTHONPATH (harnessrl installed where only root may enter,
    e.g. under /root). Probed once with a real sandboxed import; RuntimeError when neither works."""
    from harnessrl.tasks.sandbox_exec import SANDBOX_PATH, ExecLimits, SandboxRefused, run_sandboxed

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates: list[tuple[str, dict[str, str]]] = [(sys.executable, {})]
    same = shutil.which(version, path=SANDBOX_PATH)
    if same is not None:
        candidates.append((same, {"PYTHONPATH": os.pathsep.join(package_folders())}))
    tried = []
    for python, env in candidates:
        with scratch_folder("harnessrl-claweval-probe-") as folder:
            try:
                result = run_sandboxed(
                    [python, "-c", "import pydantic, yaml"],
                    workdir=folder,
                    env=env,
                    limits=ExecLimits(wall_s=60, cpu_s=60, memory_mb=GRADER_MEMORY_MB),
                    read_only=[Path(sys.prefix), *map(Path, package_folders())],
                )
            except SandboxRefused as e:  # bubblewrap could not build the sandbox for this Python
                tried.append(f"{python}: {str(e)[-200:]}")
                continue
        if result.returncode == 0:
            return python, env
        tried.append(f"{python}: {(result.stderr.strip() or result.reason)[-200:]}")
    raise RuntimeError(
        "no Python the sandbox can run imports pydantic and yaml (Claw-Eval graders need them); tried "
        + "; ".join(tried)
    )


_COMMON = r"""
import importlib.util, inspect, json, sys
from claw_eval.graders.base import AbstractGrader

def load_grader(task_dir, key):
    spec = importlib.util.spec_from_file_location("task_grader_" + key, task_dir + "/grader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if obj.__module__ == module.__name__ and issubclass(obj, AbstractGrader) and obj is not AbstractGrader:
            return obj()
    raise ValueError("grader.py defines no subclass of claw_eval.graders.base.AbstractGrader")
"""

# Imports every grader once, in one process, so a broken one is reported at load.
CHECK_SCRIPT = (
    _COMMON
    + r"""
out = {}
for key, task_dir in json.load(open(sys.argv[1])):
    try:
        load_grader(task_dir, key)
        out[key] = None
    except BaseException as e:
        out[key] = type(e).__name__ + ": " + str(e)
json.dump(out, open(sys.argv[2], "w"))
"""
)

DRIVER_SCRIPT = (
    _COMMON
    + r"""
import socket, traceback, types
grader_dir, task_dir, key = sys.argv[1:4]
data = json.load(open(grader_dir + "/trace.json", encoding="utf-8"))

class JudgeNeeded(BaseException):  # a BaseException: graders' retry loops catch Exception
    pass

class JudgeFailed(BaseException):
    pass

class NoJudge:
    def __getattr__(self, name):
        raise JudgeNeeded(name)
    def __bool__(self):
        raise JudgeNeeded("bool")

def ask(messages):
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", "")
        if isinstance(content, list):
            texts = []
            for p in content:
                if p.get("type") != "text":
                    raise JudgeFailed("the judge is text-only; the grader sent it a " + str(p.get("type")) + " part")
                texts.append(p.get("text", ""))
            content = "\n".join(texts)
        role = m.get("role", "user") if isinstance(m, dict) else getattr(m, "role", "user")
        parts.append((role, content or ""))
    prompt = parts[0][1] if len(parts) == 1 else "\n\n".join("[" + r + "]\n" + c for r, c in parts)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(grader_dir + "/judge.sock")
    s.sendall(json.dumps({"prompt": prompt}).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    answer = json.loads(buf or b"{}")
    if "reply" not in answer:
        raise JudgeFailed(answer.get("error", "no reply"))
    return answer["reply"]

def create(model=None, messages=(), **kwargs):
    reply = ask(list(messages))
    message = types.SimpleNamespace(role="assistant", content=reply, reasoning_content=None, tool_calls=None)
    choice = types.SimpleNamespace(index=0, message=message, finish_reason="stop")
    usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    return types.SimpleNamespace(choices=[choice], usage=usage, model=model)

client = types.SimpleNamespace(chat=types.SimpleNamespace(completions=types.SimpleNamespace(create=create)))
if data["judge"]:
    try:
        from claw_eval.graders.llm_judge import LLMJudge
        judge = LLMJudge(model_id="harnessrl-judge")
        judge.client = client
    except ImportError:
        judge = types.SimpleNamespace(client=client, model_id="harnessrl-judge")
else:
    judge = NoJudge()

from claw_eval.models.message import Message
from claw_eval.models.task import TaskDefinition
from claw_eval.models.trace import ToolDispatch, TraceMessage

messages = [TraceMessage(trace_id="harnessrl", message=Message.model_validate(m)) for m in data["messages"]]
dispatches = [ToolDispatch(trace_id="harnessrl", **d) for d in data["dispatches"]]
task = TaskDefinition.from_yaml(task_dir + "/task.yaml")
grader = load_grader(task_dir, key)
params = inspect.signature(grader.grade).parameters
kwargs = {"audit_data": data["audit_data"], "judge": judge}
if "media_events" in params:
    kwargs["media_events"] = []
if "env_snapshot" in params:
    kwargs["env_snapshot"] = data["env_snapshot"]
try:
    scores = grader.grade(messages, dispatches, task, **kwargs)
except JudgeNeeded:
    result = {"problem": "judge_needed"}
except JudgeFailed as e:
    result = {"problem": "judge_failed", "message": str(e)}
else:
    dump = scores.model_dump() if hasattr(scores, "model_dump") else dict(vars(scores))
    result = {"scores": dump}
json.dump(result, open(grader_dir + "/result.json", "w"), default=repr)
"""
)
