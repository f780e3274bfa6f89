"""The weights phase: the evolved harness distilled into LoRA weights that run under the seed
harness, by imitation and by on-policy distillation; the adapter with the higher dev mean is kept."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.improve.record import JobBase

if TYPE_CHECKING:
    from harnessrl.results import CollectFacts, DistillFacts


class WeightsPhase(JobBase):
    """The weights phase of the job (Improve)."""

    def _weights(self, base: dict[str, Any], evolved) -> dict[str, Any]:
        """The kept adapter ({'variant', 'adapter'}), or the base weights when there is nothing to distil."""
        if self.evolved_is_seed:
            self.decide(
                "weights.choice",
                "weights",
                "base",
                {"reason": "the evolved harness is the seed harness: there is no harness behaviour to distil"},
            )
            return {"variant": "base", "adapter": None, "model": self.config.model}
        from harnessrl.jobs.stages import NothingToDistil

        c = self.config
        # the collection and imitation stages (`harnessrl.jobs.stages`), rooted at OUT/weights (its stages.json there)
        imitation = self._stages(self.out.resolve() / "weights", str(self.out.resolve() / "harness" / "evolved.yaml"))
        variants: dict[str, dict[str, Any]] = {}
        steps = c.distill_steps
        reason: str | None = None
        collect: CollectFacts | None = None
        self._release()
        try:
            collect = imitation.collect(evolved)
            sft = imitation.sft("sft")
            imitation.sft("placebo")
        except NothingToDistil as e:  # nothing to imitate: recorded, the on-policy variant goes on alone
            reason = str(e)
        else:
            steps = int(sft.steps or 0)
            variants["imitation"] = {"adapter": "weights/sft/adapter", "steps": steps}
            variants["placebo"] = {"adapter": "weights/placebo/adapter", "steps": steps}
        finally:
            imitation.release()
        self.decide(
            "weights.imitation",
            "weights",
            "skip" if reason else "train",
            {
                "collector": c.collect_model or c.model,
                **{k: getattr(collect, k, None) for k in ("episodes", "passed", "passed_tasks")},
                "reason": reason,
                "steps": steps,
                "folder": "weights/collect",
            },
        )
        from harnessrl.train.distill import DistillError, check_protocols

        try:
            check_protocols(self.seed_spec, evolved)
        except DistillError as e:  # an edit changed the protocol: the teacher cannot read the student's replies
            self.decide("weights.on_policy", "weights", "skip", {"reason": str(e)})
        else:
            self._distill("weights/distill", evolved, steps)
            variants["on-policy"] = {"adapter": "weights/distill/adapter", "steps": steps}
        from harnessrl.jobs.study_analysis import verdict
        from harnessrl.metrics import paired_difference

        evidence: dict[str, Any] = {"base": {"folder": "harness/seed-dev", **base["record"]}}
        for name, v in variants.items():
            cell = self._cell(
                f"weights/dev-{name}", "dev", self.dev_tasks, self.seed_spec, self._adapter_model(v["adapter"])
            )
            diff = paired_difference(base["scores"], cell["scores"], seed=c.seed)
            v.update(cell=cell)
            evidence[name] = {
                "folder": cell["folder"],
                "adapter": v["adapter"],
                "steps": v["steps"],
                **cell["record"],
                "vs_base": {**diff.model_dump(), "verdict": verdict(diff)},
            }
        candidates = [n for n in ("imitation", "on-policy") if n in variants]
        if not candidates:
            self.decide("weights.choice", "weights", "base", {**evidence, "reason": "neither variant could be trained"})
            return {"variant": "base", "adapter": None, "model": c.model}
        if len(candidates) == 2:
            diff = paired_difference(variants["imitation"]["cell"]["scores"], variants["on-policy"]["cell"]["scores"])
            evidence["on_policy_vs_imitation"] = {**diff.model_dump(), "verdict": verdict(diff)}
        means = {n: variants[n]["cell"]["record"]["mean_score"] or 0.0 for n in candidates}
        # the higher dev mean; a tie keeps on-policy distillation (trained on the student's own states)
        choice = max(candidates, key=lambda n: (means[n], n == "on-policy"))
        evidence["rule"] = "the higher dev mean score under the seed harness; a tie keeps on-policy"
        self.decide("weights.choice", "weights", choice, evidence)
        return {
            "variant": choice,
            "adapter": variants[choice]["adapter"],
            "model": self._adapter_model(variants[choice]["adapter"]),
        }

    def _distill(self, stage: str, evolved, steps: int) -> DistillFacts:
        from harnessrl.results import DistillFacts, TrainResult
        from harnessrl.train.config import DistillConfig
        from harnessrl.train.distill import DistillError, run_distill

        if stage in self.runner.stages:
            return DistillFacts.model_validate(self.runner.stages[stage])
        c = self.config
        config = DistillConfig(
            teacher_harness=evolved.name,
            student_harness=self.seed_spec.name,
            model=c.model,
            device=c.device,
            dtype=self.dtype,
            suite=c.suite,
            steps=steps,
            tasks_per_step=c.distill_tasks_per_step,
            attempts=c.attempts,
            temperature=c.temperature,
            lr=c.lr,
            seed=c.seed,
            max_in_flight=c.max_in_flight,
            retries=c.retries,
        )

        def train(path: Path, resume: bool) -> TrainResult:
            return run_distill(
                config,
                path,
                resume=resume,
                progress=self.progress,
                console=self.console,
                suite=self.suite,
                teacher=evolved,
                student=self.seed_spec,
            )

        def facts(summary: TrainResult) -> DistillFacts:
            return DistillFacts(steps=summary.steps, final_kl=summary.last.get("kl"))

        what = f"on-policy distillation, {steps} steps"
        return self.runner.trained(stage, what, train, DistillError, facts, DistillFacts)
