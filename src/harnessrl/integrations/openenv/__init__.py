"""OpenEnv capture traces, both ways (docs/openenv.md).

OpenEnv's capture proxy sits between an agent program and its inference engine and records every
model call with the engine's token ids and log-probs, over the OpenAI chat, OpenAI Responses,
Anthropic Messages and Gemini dialects (each turned into a chat completion before it is
recorded). What it hands out, and what this package reads:

    rollout        the rollout document (`GET /sessions/{id}/rollout?include_messages=true`):
                   per-call records in `turns`, token arrays in `sequences`
    trace_entries  `{"session_id", "entries": [TraceEntry, ...]}` (`GET .../trace_entries`), or
                   a bare list of TraceEntry (what a loop-owning session's `fetch_proxy_trace`
                   returns)
    training_trace a `TrainingTrace` as JSON (`{"schema_version": 1, "turns": [...]}`)
    harbor         a Harbor rollout result (`HarborRolloutResult` as JSON), which also carries
                   the verifier's reward

    read_traces(src, run)      traces -> a new harnessrl run folder (one episode per trace)
    export_openenv(run, out)   a run's episodes -> trace_entries files that OpenEnv's
                               `TrainingTrace.from_entries` and TRL's HarnessRolloutWorker read

Neither direction imports openenv: the formats are JSON, and a trace is data (sizes capped, links
never followed, nothing in it executed).
"""

from harnessrl.integrations.openenv.reader import ImportResult, read_traces
from harnessrl.integrations.openenv.traces import TraceError, TraceLimits
from harnessrl.integrations.openenv.writer import ExportSummary, export_openenv, trace_document

__all__ = [
    "ExportSummary",
    "ImportResult",
    "TraceError",
    "TraceLimits",
    "export_openenv",
    "read_traces",
    "trace_document",
]
