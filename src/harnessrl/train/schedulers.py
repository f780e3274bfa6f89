"""Schedulers: which harness collects the next GRPO batch.

Every optimizer step the trainer asks `select(step)` for a Selection (one harness, or a mixture
of harnesses with their shares of the batch), collects the batch, computes advantages and the
update, then reports back with `observe(harness, advantages, sketch, rewards=...)` (sketch: the
GradientSketch of that update, or None; rewards: the scores of that harness's episodes, which
only `lilo` uses). Schedulers are seeded (random.Random(seed)) and checkpointable:
`state_dict()` is plain JSON, and after `load_state_dict` a scheduler continues exactly the
sequence it would have produced without the interruption.

Names for `make_scheduler(name, harnesses, seed, **options)`:

  mixed              every step a mixture with equal shares (the baseline HarnessBandit beats)
  uniform            one harness, uniformly at random
  round-robin        one harness, harnesses[step % K]
  single:NAME        always NAME (train on one harness)
  harness-bandit     HarnessBanditScheduler: learnability + transferability (see the class)
  learnability-only  the same with learnability_weight = 1 (ablation)
  transfer-only      the same with learnability_weight = 0 (ablation)
  ratio:H1=W1,H2=W2,...
                     every step a mixture with shares proportional to fixed weights
  dump-ucb           one harness, by a UCB on the windowed mean |advantage| (DUMP)
  sec                one harness, Boltzmann over a TD(0) estimate of the mean |advantage| (SEC)
  lilo               one harness, proportional to the success variance p(1 - p) (LILO)
"""

from __future__ import annotations

import inspect
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from harnessrl.train.sketch import cosine

# What `observe` is given: the advantages of a harness's episodes in the step, their scores.
Advantages = Sequence[float] | Tensor
Rewards = Sequence[float] | Tensor


@dataclass(frozen=True)
class Selection:
    """What to collect this step: harness -> share of the batch (shares sum to 1)."""

    shares: dict[str, float]

    @classmethod
    def one(cls, harness: str) -> Selection:
        return cls({harness: 1.0})

    @property
    def harness(self) -> str | None:
        """The harness when exactly one is selected, None for a mixture."""
        return next(iter(self.shares)) if len(self.shares) == 1 else None


def random_state_json(rng: random.Random) -> list:
    """The state of `rng` as JSON can hold it (lists, not tuples), for a checkpoint."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_random_state_json(rng: random.Random, state: list) -> None:
    """Restore `rng` to a state `random_state_json` returned."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class Scheduler:
    """Base class: equal probabilities, observe() ignores the signals, state = the RNG."""

    name = "scheduler"

    def __init__(self, harnesses: Sequence[str], seed: int = 0):
        self.harnesses = list(harnesses)
        if not self.harnesses or len(set(self.harnesses)) != len(self.harnesses):
            raise ValueError(f"need at least one harness and no duplicates, got {self.harnesses}")
        self.seed = seed
        self.rng = random.Random(seed)

    def select(self, step: int) -> Selection:
        raise NotImplementedError

    def observe(
        self, harness: str, advantages: Advantages, sketch: Tensor | None = None, rewards: Rewards | None = None
    ) -> None:
        """The step's advantages (and sketch, and episode scores) of `harness`."""
        self._check_harness(harness)
        self._observe(harness, advantages, sketch, rewards)

    def _observe(self, harness: str, advantages: Advantages, sketch: Tensor | None, rewards: Rewards | None) -> None:
        """What the scheduler learns from an observation of a known harness: nothing here."""

    def probabilities(self) -> dict[str, float]:
        """Chance (or long-run share) of each harness at the next step, for logging."""
        return {h: 1.0 / len(self.harnesses) for h in self.harnesses}

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "harnesses": self.harnesses, "rng": random_state_json(self.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("harnesses") != self.harnesses:
            raise ValueError(
                f"checkpoint is for harnesses {state.get('harnesses')}, this scheduler has {self.harnesses}"
            )
        set_random_state_json(self.rng, state["rng"])

    def _check_harness(self, harness: str) -> None:
        if harness not in self.harnesses:
            raise ValueError(f"unknown harness {harness!r}; this scheduler has {self.harnesses}")

    def _per_harness(self, saved: dict[str, Any], cast: Callable[[Any], Any]) -> dict[str, Any]:
        """A saved {harness: value} of state_dict() read back, for exactly this scheduler's harnesses."""
        return {h: cast(saved[h]) for h in self.harnesses}


class MixedScheduler(Scheduler):
    """Every step, a batch mixed from all harnesses in equal shares."""

    name = "mixed"

    def select(self, step: int) -> Selection:
        return Selection({h: 1.0 / len(self.harnesses) for h in self.harnesses})


class UniformScheduler(Scheduler):
    """One harness per step, uniformly at random."""

    name = "uniform"

    def select(self, step: int) -> Selection:
        return Selection.one(self.rng.choice(self.harnesses))


class RoundRobinScheduler(Scheduler):
    """One harness per step in turn: harnesses[step % K] (a function of the step, so resuming is trivial)."""

    name = "round-robin"

    def select(self, step: int) -> Selection:
        return Selection.one(self.harnesses[step % len(self.harnesses)])


class SingleScheduler(Scheduler):
    """Always the same harness."""

    name = "single"

    def __init__(self, harnesses: Sequence[str], harness: str, seed: int = 0):
        super().__init__(harnesses, seed)
        self._check_harness(harness)
        self.harness = harness

    def select(self, step: int) -> Selection:
        return Selection.one(self.harness)

    def probabilities(self) -> dict[str, float]:
        return {h: float(h == self.harness) for h in self.harnesses}


def _minmax(value: float, window: deque) -> float:
    """(value - min) / (max - min) over the window; 0.5 (neutral) when the window has no spread."""
    lo, hi = min(window), max(window)
    return 0.5 if hi - lo < 1e-12 else min(1.0, max(0.0, (value - lo) / (hi - lo)))


class HarnessBanditScheduler(Scheduler):
    """HarnessBandit: sample the harness whose batch is expected to teach the most, and to help the others.

    After harness h's update, observe() computes two signals:

        L_h = mean |A| over h's batch                     learnability (0 when every group is flat)
        T_h = mean over other seen harnesses o of cosine(sketch_h, E_o)
                                                          transferability; E_o = EMA of o's sketches,
                                                          E_o <- sketch_ema * E_o + (1 - sketch_ema) * sketch_o
                                                          (the first sketch of o sets E_o)

    Each is normalised by min-max over a pooled sliding window of the last `window` values of
    all harnesses (one window for L, one for T; the new value is pushed first):
    L~ = (L - min) / (max - min), 0.5 when max == min. T_h is undefined when no other harness
    has a sketch yet (or sketch is None); then T~ = 0.5 (neutral) and nothing enters the T window.

        fused_h = w * L~ + (1 - w) * T~                   w = learnability_weight
        s_h     = fused_h                                 on h's first observation
        s_h     = score_ema * s_h + (1 - score_ema) * fused_h   afterwards

    An unobserved harness has s_h = 0.5 (the middle of the normalised range), so with the bonus
    below it is explored early. Sampling probabilities, N = total observations, n_h = those of h:

        bonus_h = sqrt(ln(N + 1) / (1 + n_h))             (0 for everyone before any observation)
        q       = softmax((s_h + bonus * bonus_h) / temperature)
        p_h     = (1 - K * floor) * q_h + floor           K harnesses: every p_h >= floor

    Ablations: learnability_weight=1 (learnability-only), 0 (transfer-only).
    """

    name = "harness-bandit"

    def __init__(
        self,
        harnesses: Sequence[str],
        seed: int = 0,
        learnability_weight: float = 0.5,
        sketch_ema: float = 0.9,
        window: int = 32,
        score_ema: float = 0.5,
        bonus: float = 0.5,
        temperature: float = 0.1,
        floor: float = 0.05,
    ):
        super().__init__(harnesses, seed)
        K = len(self.harnesses)
        self.learnability_weight = _option("learnability_weight", learnability_weight, 0.0, 1.0)
        self.sketch_ema = _option("sketch_ema", sketch_ema, 0.0, 1.0, high_open=True)
        self.score_ema = _option("score_ema", score_ema, 0.0, 1.0, high_open=True)
        self.bonus = _option("bonus", bonus, 0.0, math.inf)
        self.temperature = _option("temperature", temperature, 0.0, math.inf, low_open=True)
        self.floor = _floor_option(floor, K)
        self.window = _integer_option("window", window, 2)

        self.score = {h: 0.5 for h in self.harnesses}
        self.count = {h: 0 for h in self.harnesses}
        self.total = 0
        self.sketch_avg: dict[str, Tensor] = {}
        self.l_window: deque[float] = deque(maxlen=self.window)
        self.t_window: deque[float] = deque(maxlen=self.window)

    def _observe(self, harness: str, advantages: Advantages, sketch: Tensor | None, rewards: Rewards | None) -> None:
        # as the other bandits: no advantages, or a non-finite one (a NaN would poison the window)
        learnability = float(torch.tensor(_abs_advantages(harness, advantages), dtype=torch.float64).mean())
        self.l_window.append(learnability)
        fused_l = _minmax(learnability, self.l_window)

        if sketch is not None:
            sketch = torch.as_tensor(sketch, dtype=torch.float64).reshape(-1)
        others = [avg for h, avg in self.sketch_avg.items() if h != harness]
        if sketch is not None and others:
            transfer = sum(cosine(sketch, avg) for avg in others) / len(others)
            self.t_window.append(transfer)
            fused_t = _minmax(transfer, self.t_window)
        else:
            fused_t = 0.5  # undefined: neutral

        w = self.learnability_weight
        fused = w * fused_l + (1 - w) * fused_t
        if self.count[harness] == 0:
            self.score[harness] = fused
        else:
            self.score[harness] = self.score_ema * self.score[harness] + (1 - self.score_ema) * fused
        self.count[harness] += 1
        self.total += 1
        if sketch is not None:
            previous = self.sketch_avg.get(harness)
            self.sketch_avg[harness] = (
                sketch.clone() if previous is None else self.sketch_ema * previous + (1 - self.sketch_ema) * sketch
            )

    def probabilities(self) -> dict[str, float]:
        log_n = math.log(self.total + 1)
        logits = {
            h: (self.score[h] + self.bonus * math.sqrt(log_n / (1 + self.count[h]))) / self.temperature
            for h in self.harnesses
        }
        return _floored(_softmax(logits), self.floor)

    def select(self, step: int) -> Selection:
        return _draw(self.rng, self.probabilities())

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "score": dict(self.score),
            "count": dict(self.count),
            "total": self.total,
            "sketch_avg": {h: avg.tolist() for h, avg in self.sketch_avg.items()},
            "l_window": list(self.l_window),
            "t_window": list(self.t_window),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.score = self._per_harness(state["score"], float)
        self.count = self._per_harness(state["count"], int)
        self.total = int(state["total"])
        self.sketch_avg = {h: torch.tensor(v, dtype=torch.float64) for h, v in state["sketch_avg"].items()}
        self.l_window = deque(state["l_window"], maxlen=self.window)
        self.t_window = deque(state["t_window"], maxlen=self.window)


class RatioScheduler(Scheduler):
    """Every step a mixture with fixed shares: share_h = weight_h / sum of the weights.

    A static data mix, set by hand and never adapted: what a multi-source RL run does when each
    source is given a fixed ratio of every batch. A weight of 0 leaves a harness out. `mixed` is
    the special case of equal weights.
    """

    name = "ratio"

    def __init__(self, harnesses: Sequence[str], weights: dict[str, Any], seed: int = 0):
        super().__init__(harnesses, seed)
        if not isinstance(weights, dict):
            raise ValueError(f"ratio weights must be a mapping harness -> weight, got {weights!r}")
        unknown = [h for h in weights if h not in self.harnesses]
        if unknown:
            raise ValueError(f"ratio: unknown harness(es) {', '.join(map(repr, unknown))}; harnesses: {self.harnesses}")
        missing = [h for h in self.harnesses if h not in weights]
        if missing:
            raise ValueError(
                f"ratio: no weight for {', '.join(map(repr, missing))}; give every harness one (0 leaves it out)"
            )
        self.weights = {h: _option(f"the weight of {h}", weights[h], 0.0, math.inf) for h in self.harnesses}
        total = math.fsum(self.weights.values())
        if total <= 0:
            raise ValueError(f"ratio: at least one weight must be > 0, got {self.weights}")
        self.shares = {h: w / total for h, w in self.weights.items()}

    def select(self, step: int) -> Selection:
        return Selection({h: s for h, s in self.shares.items() if s > 0})

    def probabilities(self) -> dict[str, float]:
        return dict(self.shares)


class _EpisodeWindows(Scheduler):
    """Base of the schedulers that keep each harness's values of its last `window` episodes (`recent`)."""

    def __init__(self, harnesses: Sequence[str], seed: int, window: int):
        super().__init__(harnesses, seed)
        self.window = _integer_option("window", window, 1)
        self.recent: dict[str, deque[float]] = {h: deque(maxlen=self.window) for h in self.harnesses}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "recent": {h: list(v) for h, v in self.recent.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.recent = self._per_harness(state["recent"], lambda values: deque(map(float, values), maxlen=self.window))


class DumpUCBScheduler(_EpisodeWindows):
    """DUMP's distribution-level curriculum over harnesses: a UCB on the expected absolute advantage.

    Every episode's |A| enters its harness's sliding window (the last `window` values); counts are
    in episodes, N = all observed episodes, n_h = those of h:

        score_h = mean of h's window + c * sqrt(2 ln N / n_h)
        p       = softmax(score / temperature)          temperature 0: the argmax (ties share equally)

    Until every harness has been observed, the untried ones are drawn uniformly (the UCB needs
    n_h >= 1). `select` draws one harness from p; DUMP draws each example's source from p
    instead, so its batches are mixtures with these expected shares.
    """

    name = "dump-ucb"

    def __init__(
        self, harnesses: Sequence[str], seed: int = 0, window: int = 300, c: float = 1.0, temperature: float = 0.1
    ):
        super().__init__(harnesses, seed, window)
        self.c = _option("c", c, 0.0, math.inf)
        self.temperature = _option("temperature", temperature, 0.0, math.inf)
        self.count = {h: 0 for h in self.harnesses}
        self.total = 0

    def _observe(self, harness: str, advantages: Advantages, sketch: Tensor | None, rewards: Rewards | None) -> None:
        values = _abs_advantages(harness, advantages)
        self.recent[harness].extend(values)
        self.count[harness] += len(values)
        self.total += len(values)

    def scores(self) -> dict[str, float | None]:
        """The UCB score of every harness; None for one not observed yet."""
        log_n = math.log(max(self.total, 1))
        return {
            h: math.fsum(self.recent[h]) / len(self.recent[h]) + self.c * math.sqrt(2 * log_n / self.count[h])
            if self.count[h]
            else None
            for h in self.harnesses
        }

    def probabilities(self) -> dict[str, float]:
        scores = self.scores()
        untried = [h for h, s in scores.items() if s is None]
        if untried:
            return {h: 1.0 / len(untried) if h in untried else 0.0 for h in self.harnesses}
        tried = {h: s for h, s in scores.items() if s is not None}  # every harness, here
        if self.temperature == 0:
            top = max(tried.values())
            best = [h for h, s in tried.items() if s >= top - 1e-12]
            return {h: 1.0 / len(best) if h in best else 0.0 for h in self.harnesses}
        return _softmax({h: s / self.temperature for h, s in tried.items()})

    def select(self, step: int) -> Selection:
        return _draw(self.rng, self.probabilities())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "count": dict(self.count), "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.count = self._per_harness(state["count"], int)
        self.total = int(state["total"])


class SecScheduler(Scheduler):
    """SEC (self-evolving curriculum): a non-stationary bandit whose value is a TD(0) estimate of
    the mean absolute advantage, sampled by a Boltzmann distribution.

    After h's update, with r = mean |A| over h's episodes of the step:

        Q_h <- Q_h + alpha * (r - Q_h)                  every Q starts at 0
        p   = softmax(Q / tau)

    `select` draws one harness from p; SEC draws each problem's category from p instead, so its
    batches are mixtures with these expected shares.
    """

    name = "sec"

    def __init__(self, harnesses: Sequence[str], seed: int = 0, alpha: float = 0.5, tau: float = 0.2):
        super().__init__(harnesses, seed)
        self.alpha = _option("alpha", alpha, 0.0, 1.0, low_open=True)
        self.tau = _option("tau", tau, 0.0, math.inf, low_open=True)
        self.q = {h: 0.0 for h in self.harnesses}

    def _observe(self, harness: str, advantages: Advantages, sketch: Tensor | None, rewards: Rewards | None) -> None:
        values = _abs_advantages(harness, advantages)
        reward = math.fsum(values) / len(values)
        self.q[harness] += self.alpha * (reward - self.q[harness])

    def probabilities(self) -> dict[str, float]:
        return _softmax({h: q / self.tau for h, q in self.q.items()})

    def select(self, step: int) -> Selection:
        return _draw(self.rng, self.probabilities())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "q": dict(self.q)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)  # (a "count" that older checkpoints hold is not read)
        self.q = self._per_harness(state["q"], float)


class LiloScheduler(_EpisodeWindows):
    """LILO's learnability at the level of harnesses: prefer the harness whose success rate is near 1/2.

    p_h is the mean score of h's last `window` episodes (scores in [0, 1]; a success rate for
    pass/fail scores). Its success variance l_h = p_h (1 - p_h) is 0 where every episode fails or
    every one succeeds, 1/4 at p_h = 1/2; a harness not observed yet counts as 1/4 (tried early).

        q_h = l_h / sum of l                            (uniform when every l is 0)
        p_h = (1 - K * floor) * q_h + floor             K harnesses: no harness starves

    LILO scores each question by the variance of its own outcomes; here a harness's episodes
    are pooled, so a harness whose tasks are half always solved and half never solved also has
    p_h = 1/2. `select` draws one harness from p. Needs the rewards: `observe(..., rewards=...)`.
    """

    name = "lilo"

    def __init__(self, harnesses: Sequence[str], seed: int = 0, window: int = 128, floor: float = 0.05):
        super().__init__(harnesses, seed, window)
        self.floor = _floor_option(floor, len(self.harnesses))

    def _observe(self, harness: str, advantages: Advantages, sketch: Tensor | None, rewards: Rewards | None) -> None:
        if rewards is None:
            raise ValueError(f"lilo needs the episodes' scores: observe({harness!r}, advantages, sketch, rewards=...)")
        values = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1).tolist()
        if not values:
            raise ValueError(f"observe({harness!r}) got no rewards")
        bad = [r for r in values if not 0.0 <= r <= 1.0]
        if bad:
            raise ValueError(f"lilo reads scores in [0, 1] as success rates; {harness!r} got {bad[0]!r}")
        self.recent[harness].extend(values)

    def success_rate(self) -> dict[str, float | None]:
        """Mean score over each harness's window; None for one not observed yet."""
        return {h: math.fsum(v) / len(v) if v else None for h, v in self.recent.items()}

    def learnability(self) -> dict[str, float]:
        return {h: 0.25 if p is None else p * (1 - p) for h, p in self.success_rate().items()}

    def probabilities(self) -> dict[str, float]:
        values = self.learnability()
        total = math.fsum(values.values())
        K = len(self.harnesses)
        return _floored({h: values[h] / total if total > 0 else 1.0 / K for h in self.harnesses}, self.floor)

    def select(self, step: int) -> Selection:
        return _draw(self.rng, self.probabilities())


def _abs_advantages(harness: str, advantages: Sequence[float] | Tensor) -> list[float]:
    """|A| of every episode; no advantages, or a non-finite one, is an error."""
    adv = torch.as_tensor(advantages, dtype=torch.float64).reshape(-1)
    if adv.numel() == 0:
        raise ValueError(f"observe({harness!r}) got no advantages")
    if not bool(torch.isfinite(adv).all()):
        raise ValueError(f"observe({harness!r}) got a non-finite advantage")
    return adv.abs().tolist()


def _softmax(logits: dict[str, float]) -> dict[str, float]:
    top = max(logits.values())  # subtract the max: exp never overflows
    weights = {h: math.exp(z - top) for h, z in logits.items()}
    total = math.fsum(weights.values())
    return {h: w / total for h, w in weights.items()}


def _floored(q: dict[str, float], floor: float) -> dict[str, float]:
    """(1 - K * floor) * q_h + floor for each of the K harnesses: every probability >= floor."""
    return {h: (1 - len(q) * floor) * p + floor for h, p in q.items()}


def _draw(rng: random.Random, probabilities: dict[str, float]) -> Selection:
    """One harness drawn from `probabilities` (one draw of the RNG)."""
    names = list(probabilities)
    return Selection.one(rng.choices(names, weights=[probabilities[h] for h in names])[0])


def _integer_option(name: str, value: Any, low: int) -> int:
    """An integer option >= low; accepts numeric strings ("32", "32.0")."""
    x = _option(name, value, low, math.inf)
    if x % 1:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(x)


def _floor_option(value: Any, harnesses: int) -> float:
    """The exploration floor: every harness's probability is at least this, so K * floor < 1."""
    floor = _option("floor", value, 0.0, 1.0)
    if harnesses * floor >= 1.0:
        raise ValueError(f"floor * number of harnesses must be < 1, got {floor} * {harnesses}")
    return floor


def _parse_ratio(spec: str) -> dict[str, str]:
    """'H1=W1,H2=W2' -> {H1: 'W1', H2: 'W2'} (the weights are checked by RatioScheduler)."""
    weights: dict[str, str] = {}
    for item in spec.split(","):
        harness, sep, weight = item.partition("=")
        harness = harness.strip()
        if not sep or not harness or not weight.strip():
            raise ValueError(f"ratio wants HARNESS=WEIGHT items separated by commas, got {item!r} in {spec!r}")
        if harness in weights:
            raise ValueError(f"ratio: harness {harness!r} is given twice in {spec!r}")
        weights[harness] = weight.strip()
    return weights


def _option(name: str, value: Any, low: float, high: float, low_open: bool = False, high_open: bool = False) -> float:
    """A float option checked against [low, high] (open ends where asked); accepts numeric strings."""
    try:
        if isinstance(value, bool):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    ok_low = x > low if low_open else x >= low
    ok_high = x < high if high_open else x <= high
    if not (ok_low and ok_high and math.isfinite(x)):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return x


_MULTI = {
    "mixed": MixedScheduler,
    "uniform": UniformScheduler,
    "round-robin": RoundRobinScheduler,
    "harness-bandit": HarnessBanditScheduler,
    "learnability-only": HarnessBanditScheduler,
    "transfer-only": HarnessBanditScheduler,
    "dump-ucb": DumpUCBScheduler,
    "sec": SecScheduler,
    "lilo": LiloScheduler,
}
_ABLATIONS = {"learnability-only": 1.0, "transfer-only": 0.0}
KNOWN_SCHEDULERS = (
    "mixed",
    "uniform",
    "round-robin",
    "single:NAME",
    "harness-bandit",
    "learnability-only",
    "transfer-only",
    "ratio:H1=W1,H2=W2,...",
    "dump-ucb",
    "sec",
    "lilo",
)


def make_scheduler(name: str, harnesses: Sequence[str], seed: int = 0, **options: Any) -> Scheduler:
    """Build a scheduler by name (see the module docstring); options go to its constructor."""
    harnesses = list(harnesses)
    cls: type[Scheduler]
    fixed: dict[str, Any]  # constructor arguments the name sets
    if name.startswith("single:"):
        target = name.split(":", 1)[1]
        if target not in harnesses:
            raise ValueError(f"{name}: harness {target!r} is not one of {harnesses}")
        cls, fixed = SingleScheduler, {"harness": target}
    elif name.startswith("ratio:"):
        cls, fixed = RatioScheduler, {"weights": _parse_ratio(name.split(":", 1)[1])}
    elif name == "ratio":
        raise ValueError("ratio needs its weights in the name: ratio:H1=W1,H2=W2,... (one per harness)")
    elif name in _MULTI:
        if len(harnesses) < 2:
            raise ValueError(f"scheduler {name!r} needs at least 2 harnesses, got {harnesses} (use single:NAME)")
        cls, fixed = _MULTI[name], {}
        if name in _ABLATIONS:
            if "learnability_weight" in options:
                raise ValueError(f"{name} fixes learnability_weight; use harness-bandit to set it")
            fixed = {"learnability_weight": _ABLATIONS[name]}
    else:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(KNOWN_SCHEDULERS)}")

    reserved = ("self", "harnesses", "seed", *fixed)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in reserved]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"scheduler {name!r} has no option(s) {', '.join(unknown)}; accepted: {', '.join(accepted) or 'none'}"
        )
    scheduler = cls(harnesses, seed=seed, **fixed, **options)
    scheduler.name = name  # recorded in state_dict: "transfer-only", "single:react", ...
    return scheduler
