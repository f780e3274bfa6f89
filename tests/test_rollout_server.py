"""GRPO with its rollouts on a server (`harnessrl train grpo --rollout-server URL`), served by
`harnessrl serve` in this process: the same scheduler sequence, rewards and losses as the
in-process run, the adapter hot-reloaded after every update, every model call stamped with the
policy version that sampled it, and clear errors for a server that cannot be used."""

from __future__ import annotations

import json
import math

import pytest
from helpers import grpo_trainer, keyed_server
from test_trainer import BASE, SPECS, TextScore, lines

from harnessrl.store import RunStore
from harnessrl.train.rollout_server import ADAPTERS_DIR
from harnessrl.train.trainer import TrainError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


CONFIG = BASE.replace(eval_every=0)


def run(out, config):
    grpo_trainer(config, out, suite=TextScore(), specs=SPECS, progress=False).run()
    return lines(out / "metrics.jsonl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout-server")
    local = run(root / "local", CONFIG)
    with keyed_server("tiny-random") as url:  # the trainer sends $HARNESSRL_ADMIN_KEY
        served = run(root / "served", CONFIG.replace(rollout_servers=[url]))
    return root, local, served


def test_a_served_run_matches_the_in_process_run(runs):
    _, local, served = runs
    assert [r["harness"] for r in served] == [r["harness"] for r in local]
    assert [r["reward_mean"] for r in served] == [r["reward_mean"] for r in local]
    assert [r["optimizer_step"] for r in served] == [r["optimizer_step"] for r in local]
    assert sum(r["optimizer_step"] for r in local) >= 2  # the weights moved, so the reloads mattered
    for a, b in zip(local, served):
        if a["loss"] is None:
            assert b["loss"] is None
        else:
            assert math.isclose(a["loss"], b["loss"], rel_tol=1e-4, abs_tol=1e-6), (a["loss"], b["loss"])
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-6)


def test_every_model_call_records_the_policy_version_that_sampled_it(runs):
    root, local, served = runs
    assert all(r["policy_lag_max"] == 0 for r in served)
    assert all("policy_lag_max" not in r for r in local)
    updated_before = [sum(r["optimizer_step"] for r in served[:i]) for i in range(len(served))]
    with RunStore(root / "served" / "rollouts") as store:
        trajs = list(store.trajectories())
    G = CONFIG.group_size
    for t in trajs:
        step = t.attempt // G
        for s in t.steps:
            assert s.model_call.policy_version == updated_before[step] and s.model_call.completion_ids
    # every version had a folder of its own; at the end only the last one published is left (the
    # others were unloaded and deleted once idle): the one the last step's rollouts came from
    folders = list((root / "served" / ADAPTERS_DIR).iterdir())
    assert [f.name.split("-")[0] for f in folders] == [f"v{updated_before[-1]}"]
    assert (folders[0] / "adapter_config.json").is_file()
    config = json.loads((root / "served" / "config.json").read_text())
    assert config["rollout_probe"]["max_abs_diff"] < 1e-4  # fp32 on both sides of the probe
    assert config["rollout_servers"] and config["rollout_servers"][0].startswith("http://127.0.0.1:")


def test_an_unreachable_server_is_a_clear_error_before_training(tmp_path):
    config = CONFIG.replace(rollout_servers=["http://127.0.0.1:9/v1"])
    with pytest.raises(TrainError, match=r"rollout server http://127.0.0.1:9/v1 does not answer GET /v1/models"):
        grpo_trainer(config, tmp_path / "o", suite=TextScore(), specs=SPECS, progress=False).run()
    assert not (tmp_path / "o" / "metrics.jsonl").exists()
