"""The update's torch threads: every core of the process's share where nothing runs beside it, the
user's count where one is set, the engine's count where rollouts overlap the update."""

from __future__ import annotations

import pytest
import torch
from test_trainer import BASE, _set_up, _units

from harnessrl.train import trainer as trainer_module
from harnessrl.train.config import TrainConfig
from harnessrl.train.trainer import TrainError
from harnessrl.train.update import UPDATE_THREADS_ENV, cores_for_update, update_threads

SYNC = TrainConfig(model="tiny-random", device="cpu")
OVERLAPPED = TrainConfig(
    model="tiny-random", device="cpu", max_off_policy_steps=1, rollout_servers=["http://127.0.0.1:1/v1"]
)


def test_a_synchronous_update_takes_the_whole_share_of_the_machine():
    now = torch.get_num_threads()
    assert update_threads(SYNC, None, None, now + 3, env={}) == now + 3
    # several processes on one machine: each one's share, not the machine
    assert update_threads(SYNC, None, now + 1, now + 7, env={}) == now + 1
    # no more cores than the engine already uses: unchanged
    assert update_threads(SYNC, None, None, now, env={}) is None


def test_a_count_the_user_set_and_overlapping_rollouts_keep_the_engines_count():
    now = torch.get_num_threads()
    assert update_threads(SYNC, 1, None, now + 3, env={}) is None  # $HARNESSRL_THREADS / engine options
    assert update_threads(OVERLAPPED, None, None, now + 3, env={}) is None  # the next rollouts run meanwhile
    assert update_threads(SYNC, None, None, now + 3, device="cuda", env={}) is None


def test_the_update_threads_variable_wins_and_a_bad_one_is_refused():
    assert update_threads(OVERLAPPED, 1, None, 64, env={UPDATE_THREADS_ENV: "3"}) == 3
    for bad in ("two", "0", "-1"):
        with pytest.raises(ValueError, match=UPDATE_THREADS_ENV):
            update_threads(SYNC, None, None, 4, env={UPDATE_THREADS_ENV: bad})


def test_the_trainer_updates_on_the_chosen_threads_and_restores_the_engines(tmp_path, monkeypatch):
    """With the variables unset and one more CPU than torch's threads, the update runs on all of
    them; the count is back to the engine's after it."""
    monkeypatch.delenv(UPDATE_THREADS_ENV, raising=False)
    monkeypatch.delenv("HARNESSRL_THREADS", raising=False)
    before = torch.get_num_threads()
    import harnessrl.models.engine as engine_module

    monkeypatch.setattr(engine_module, "usable_cpus", lambda: before + 1)
    t = _set_up(tmp_path / "out", BASE)
    assert t.update_threads == before + 1
    seen: list[int] = []
    real = trainer_module.update_policy

    def recording(ctx, units, step):
        seen.append(torch.get_num_threads())
        return real(ctx, units, step)

    monkeypatch.setattr(trainer_module, "update_policy", recording)
    t._update(_units(t), 0)
    assert seen == [before + 1]
    assert torch.get_num_threads() == before


def test_a_bad_update_threads_variable_is_a_clear_error_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv(UPDATE_THREADS_ENV, "all")
    with pytest.raises(TrainError, match=UPDATE_THREADS_ENV):
        _set_up(tmp_path / "out", BASE)


def test_cores_for_update_restores_the_count_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with cores_for_update(before + 1):
            assert torch.get_num_threads() == before + 1
            raise RuntimeError("the update failed")
    assert torch.get_num_threads() == before
    with cores_for_update(None):
        assert torch.get_num_threads() == before
