"""harnessrl inside TRL's GRPOTrainer (`pip install 'harnessrl[trl]'`; docs/trl.md).

from harnessrl.integrations.trl import HarnessRollout

rollout = HarnessRollout("toolcalc", ["json-tools", "react", "plan-execute"], scheduler="harness-bandit")
trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=rollout.dataset("train"),
                      reward_funcs=rollout.reward, rollout_func=rollout, callbacks=[rollout.callback])

rollout.py      HarnessRollout (rollout_func + reward + callback), EpisodeReward
callback.py     HarnessSchedulerCallback: sketch, observe, save and resume the schedule
setup.py        what is read of a TRL trainer, and what is refused
                (the evaluations of trained and held-out harnesses: HarnessRollout.evaluate, over
                harnessrl.train.held_out)
async_worker.py HarnessRolloutWorker: a harness scheduler in TRL's AsyncGRPOTrainer
async_serve.py  its adapter transfer to harnessrl serve, and CPU stand-ins
"""

from harnessrl.integrations.trl.callback import HarnessSchedulerCallback
from harnessrl.integrations.trl.rollout import EpisodeReward, HarnessRollout
from harnessrl.integrations.trl.setup import HarnessRolloutError, RolloutInputError, TRLSetupError

__all__ = [
    "EpisodeReward",
    "HarnessRollout",
    "HarnessRolloutError",
    "HarnessSchedulerCallback",
    "RolloutInputError",
    "TRLSetupError",
]
