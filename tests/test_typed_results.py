"""Results are typed: a public function of the package that returns a bare `dict` (or
`dict[str, Any]`, or either or None) must be in ALLOWED with the reason a plain dict is right
there. A job's result and a comparison never are: they return the pydantic models of
harnessrl.results (and metrics.PairedDifference, evolve.acceptance.Comparison).

The functions are read from the source with `ast` (nothing is imported): module-level functions
and the methods of public classes, whose names do not start with an underscore. An entry of
ALLOWED must still name such a function (the test fails on one that no longer does), so the list
can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import harnessrl

PACKAGE_DIR = Path(harnessrl.__file__).parent
BARE = {"dict", "dict[str, Any]", "Dict", "Dict[str, Any]"}

# Reasons shared by several entries.
HTTP = "a JSON body of an HTTP route or its part, in the wire format the API defines"
TO_JSON = "a record's own JSON form (written into a file as it is), the model or dataclass being the typed side"
DESCRIBE = "what a policy or executor says of itself for a run folder's config.json: free-form by backend"
STATE = "a resumable object's state, written into a checkpoint's state.json and read back as it is"
ADAPTER_FACTS = "keyword arguments of lora.write_adapter: the extra keys of the adapter's harnessrl.json"
STORED_CONFIG = "a run folder's recorded configuration, as JSON gives it back (any job's)"
SCHEMA = "a JSON schema (or a part of one) handed to a model or a validator"
RECORD = "one line of a JSON log (metrics.jsonl, evolution.jsonl, decisions.jsonl, eval.jsonl), keys as written"
TOOL_ARGS = "a tool call's arguments: keyword arguments of the task's tool"
TRL_STATE = "what a TRL checkpoint keeps in its TrainerState, read back as it is"
TRACE = "a JSON object of an OpenEnv trace, checked to be one, in that format"

ALLOWED: dict[str, str] = {
    "audit:AuditReport.to_json": TO_JSON,
    "audit_agent:HarnessAudit.to_json": TO_JSON,
    "harness.mcp_tools:TaskToolServer.handle": HTTP,
    "preflight:PreflightReport.to_json": TO_JSON,
    "cli.common:config_fields": "name -> pydantic FieldInfo of any config model: keyword arguments of the model",
    "config:cli": "the json_schema_extra of a config field: a pydantic hook that takes a plain dict",
    "evolve.acceptance:NoiseEstimate.to_json": TO_JSON,
    "evolve.config:EvolveConfig.to_json": TO_JSON,
    "evolve.loop:CandidateLine.to_json": TO_JSON,
    "evolve.loop:Measurement.dev_record": RECORD,
    "evolve.proposers:Proposal.to_json": TO_JSON,
    "evolve.proposers:worked_example": "a demonstration for the proposer: instruction, calls and results as JSON",
    "executors.base:Executor.describe": DESCRIBE,
    "executors.ray_actors:EpisodeHost.where": "where a Ray actor runs (node, pid), recorded as it is in config.json",
    "executors.ray_actors:RayExecutor.describe": DESCRIBE,
    "export:atif_trajectory": "a trajectory in Harbor's ATIF JSON format, as that format defines it",
    "export:episode_metadata": "the free-form metadata of an exported sample (Inspect AI's `metadata` field)",
    "harness.external:ExternalEpisode.record": HTTP,
    "harness.oracle:Oracle.describe": DESCRIBE,
    "harness.prompt_tools:reply_message": "a chat message with tool_calls, as the chat completions API writes it",
    "harness.protocols.shared:arg_schema": SCHEMA,
    "harness.protocols.shared:tool_properties": SCHEMA,
    "harness.recording:RecordedEpisode.record": HTTP,
    "harness.rules:fill_helper_arguments": TOOL_ARGS,
    "harness.rules:helper_parameters": SCHEMA,
    "harness.spec:ExternalHarnessSpec.to_dict": TO_JSON,
    "harness.spec:HarnessSpec.to_dict": TO_JSON,
    "harness.spec:spec_json_schema": SCHEMA,
    "jobs.stages:Stages.read": "stages.json as stored: each finished stage's facts, read back by its stage",
    "jobs.study_analysis:cell_analysis": "a cell's record, per-task scores and failure rates: compare_cells' input",
    "kernel:option_values": "a job config's options as JSON values: what options.json keeps",
    "kernel:job_record": STORED_CONFIG,
    "kernel:stored_options": STORED_CONFIG,
    "models.base:Policy.describe": DESCRIBE,
    "models.engine_config:EngineConfig.to_dict": TO_JSON,
    "models.hf:HFPolicy.describe": DESCRIBE,
    "models.hf:HFPolicy.engine_stats": "the engine's counters for a benchmark's JSON output: free-form by engine",
    "models.hf:HFPolicy.quantize_int8": "module name -> what int8 quantization did to it, for a benchmark's JSON",
    "models.int8:quantize_int8": "module name -> what int8 quantization did to it, for a benchmark's JSON",
    "models.openai_compat:OpenAIPolicy.describe": DESCRIBE,
    "models.scripted:ScriptedPolicy.describe": DESCRIBE,
    "report.build:report_json": "the JSON the HTML report embeds for its script",
    "report.episodes:episode_detail": "the JSON the trajectory viewer embeds for one episode",
    "report.episodes:episode_row": "one row of the trajectory viewer's JSON table",
    "report.episodes:time_breakdown": "one episode's seconds by part, for the viewer's JSON",
    "report.study:load_study": "study.json as stored, whichever version wrote it (the report renders older ones)",
    "rollout:EpisodePolicies.describe": DESCRIBE,
    "rundir:RunFolder.stored_config": STORED_CONFIG,
    "serve.models:ServedModel.card": HTTP,
    "store:RunStore.config": STORED_CONFIG,
    "tasks.base:solution_call": "a tool call as suites write their known solutions ({name, arguments})",
    "tasks.importers.claweval.grading:env_snapshot": "Claw-Eval's env_snapshot, in the format its graders read",
    "tasks.suites.planning_world:plan_to_itinerary": "an itinerary as the planning grader's JSON format defines it",
    "tasks.suites.pools:load_pools": "a suite's data file as JSON gives it back",
    "harness.sampled_turns:SampledTurns.summary": "an episode's counts, as its meta['sampled_turns'] keeps them",
    "integrations.openenv.traces:Checked.obj": TRACE,
    "integrations.openenv.traces:Checked.opt_obj": TRACE,
    "integrations.trl.async_worker:trl_shaping": "keyword arguments of SamplingParams (TRL's sampling fields)",
    "integrations.trl.callback:ScheduleOwner.state": TRL_STATE,
    "integrations.trl.rollout:HarnessRollout.state": TRL_STATE,
    "train.checkpoint:restore": STATE,
    "train.checkpoint:rng_state": STATE,
    "train.distill:DistillRun.adapter_facts": ADAPTER_FACTS,
    "train.distill:DistillRun.train_step": RECORD,
    "train.lora:WritesAdapter.adapter_facts": ADAPTER_FACTS,
    "train.rollout_server:ProbeReport.as_dict": TO_JSON,
    "train.rollout_server:RolloutServers.describe": DESCRIBE,
    "train.harness_schedule:HarnessSchedule.state_dict": STATE,
    "train.schedulers:DumpUCBScheduler.state_dict": STATE,
    "train.schedulers:HarnessBanditScheduler.state_dict": STATE,
    "train.schedulers:Scheduler.state_dict": STATE,
    "train.schedulers:SecScheduler.state_dict": STATE,
    "train.sft:SFTRun.adapter_facts": ADAPTER_FACTS,
    "train.sft_data:example_row": "one row of an exported Hugging Face dataset (its columns)",
    "train.step:StepPlan.to_dict": TO_JSON,
    "train.step:StepRecord.as_dict": RECORD,
    "train.trainer:Trainer.adapter_facts": ADAPTER_FACTS,
    "train.trainer:Trainer.record": STORED_CONFIG,
    "train.trainer:Trainer.train_step": RECORD,
    "triage:HarnessTriage.to_json": TO_JSON,
    "triage:Verdict.to_json": TO_JSON,
    "wire.chat:ServeError.body": HTTP,
    "wire.chat:completion_body": HTTP,
    "wire.chat:error_body": HTTP,
    "wire.chat:usage": HTTP,
    "wire.gemini:error_body": HTTP,
    "wire.gemini:error_for": HTTP,
    "wire.gemini:logprobs_result": HTTP,
    "wire.gemini:response_body": HTTP,
    "wire.gemini:usage": HTTP,
    "wire.messages:error_body": HTTP,
    "wire.messages:error_for": HTTP,
    "wire.messages:message_body": HTTP,
    "wire.messages:usage": HTTP,
    "wire.responses:custom_as_function": HTTP,
    "wire.responses:response_body": HTTP,
    "wire.responses:usage": HTTP,
}

# Jobs and comparisons: each returns a typed result (never a dict, never in ALLOWED).
TYPED: dict[str, str] = {
    "jobs.evaluate:run_eval": "EvalSummary",
    "eval_folder:write_summary": "EvalSummary",
    "eval_folder:EvaluationFolder.summary": "EvalSummary",
    "train.trainer:Trainer.run": "TrainResult",
    "train.trainer:Trainer.evaluate": "TrainEval | None",
    "train.distill:DistillRun.run": "TrainResult",
    "train.distill:run_distill": "TrainResult",
    "train.sft:SFTRun.train": "SFTTrained",
    "train.sft:run_sft": "SFTResult",
    "evolve.loop:Evolution.run": "EvolveResult",
    "evolve.run:run_evolve": "EvolveResult",
    "jobs.study:Study.run": "StudyResult",
    "jobs.study:run_study": "StudyResult",
    "jobs.study:study_result": "StudyResult",
    "improve.job:Improve.run": "ImproveResult | ImproveStopped",
    "improve.job:run_improve": "ImproveResult | ImproveStopped",
    "improve.record:decide": "Decision",
    "jobs.stages:Stages.collect": "CollectFacts",
    "jobs.stages:Stages.sft": "AdapterFacts",
    "jobs.stages:Stages.trained": "F",
    "metrics:harness_summary": "HarnessSummary",
    "metrics:paired_difference": "PairedDifference",
    "evolve.acceptance:compare": "Comparison",
    "jobs.study_analysis:compare_cells": "CellComparison",
    "jobs.study_analysis:recommend": "Recommendation",
}


def public_functions(package_dir: Path) -> dict[str, str]:
    """ "module:Class.function" (or "module:function") -> its return annotation as written, for
    every public function and public method of a public class that has one."""
    found: dict[str, str] = {}
    for path in sorted(package_dir.rglob("*.py")):
        module = ".".join(path.relative_to(package_dir).with_suffix("").parts).removesuffix(".__init__")

        def visit(body: list[ast.stmt], owner: str) -> None:
            for node in body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    visit(node.body, f"{owner}{node.name}.")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    if node.returns is not None:
                        found[f"{module}:{owner}{node.name}"] = ast.unparse(node.returns)

        visit(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


def returns_a_bare_dict(annotation: str) -> bool:
    """`dict`, `dict[str, Any]`, either `| None`, or `Optional[...]` of either."""
    if annotation.startswith("Optional[") and annotation.endswith("]"):
        annotation = annotation[len("Optional[") : -1]
    parts = {p.strip() for p in annotation.split("|")} - {"None"}
    return bool(parts) and parts <= BARE


def test_every_bare_dict_result_is_allowed_with_a_reason():
    functions = public_functions(PACKAGE_DIR)
    bare = sorted(name for name, annotation in functions.items() if returns_a_bare_dict(annotation))
    unexplained = [name for name in bare if name not in ALLOWED]
    assert not unexplained, (
        "these public functions return a plain dict: return a pydantic model (see harnessrl.results and "
        f"harnessrl.types), or add them to ALLOWED with the reason a dict is right there: {unexplained}"
    )
    stale = sorted(set(ALLOWED) - set(bare))
    assert not stale, f"ALLOWED names functions that no longer return a plain dict (remove them): {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_jobs_and_comparisons_return_their_models():
    functions = public_functions(PACKAGE_DIR)
    assert not set(TYPED) & set(ALLOWED)
    wrong = {name: functions.get(name) for name, model in TYPED.items() if functions.get(name) != model}
    assert not wrong, f"a job or comparison does not return its model (name: annotation found): {wrong}"


def test_the_check_reads_annotations_as_written():
    assert returns_a_bare_dict("dict") and returns_a_bare_dict("dict[str, Any]")
    assert returns_a_bare_dict("dict[str, Any] | None") and returns_a_bare_dict("Optional[dict]")
    assert not returns_a_bare_dict("dict[str, float]") and not returns_a_bare_dict("EvalSummary")
    assert not returns_a_bare_dict("None")
