"""The study's numbers, from the cells' trajectories to study.json's analysis: each cell's record
(`cell_analysis`), the paired differences of the score between cells and of the content-failure
rate before and after distillation, the failure-class effects (`class_effects`), and the
recommendation (`recommend`) that reads them. Pure functions of their inputs: the stages that
produce the trajectories are in harnessrl.jobs.study.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harnessrl.metrics import PairedDifference
from harnessrl.results import CellComparison, Recommendation

# cell -> (harness side, weights)
CELLS: dict[str, tuple[str, str]] = {
    "seed-base": ("seed", "base"),
    "evolved-base": ("evolved", "base"),
    "seed-distilled": ("seed", "distilled"),
    "evolved-distilled": ("evolved", "distilled"),
    "seed-placebo": ("seed", "placebo"),
}
# name -> (cell a, cell b): every difference is b - a, paired by task
COMPARISONS: dict[str, tuple[str, str]] = {
    "distilled_vs_base_under_seed": ("seed-base", "seed-distilled"),
    "evolved_vs_seed_under_base": ("seed-base", "evolved-base"),
    "placebo_vs_base_under_seed": ("seed-base", "seed-placebo"),
    "evolved_distilled_vs_seed_base": ("seed-base", "evolved-distilled"),
    "distilled_vs_placebo_under_seed": ("seed-placebo", "seed-distilled"),
}
# how the text of the recommendation names them
LABELS: dict[str, str] = {
    "distilled_vs_base_under_seed": "distilled vs base weights, under the seed harness",
    "evolved_vs_seed_under_base": "evolved vs seed harness, with the base weights",
    "placebo_vs_base_under_seed": "placebo vs base weights, under the seed harness",
    "evolved_distilled_vs_seed_base": "evolved harness + distilled weights vs seed harness + base weights",
    "distilled_vs_placebo_under_seed": "distilled vs placebo weights, under the seed harness",
}


def verdict(diff: PairedDifference | dict[str, Any] | None) -> str:
    """What a paired difference (as computed, or as a JSON file holds it) allows to claim: "lower"
    or "higher" when its 95% interval excludes 0, "no claim" when the interval includes 0, "no
    data" without one."""
    ci = diff.ci95 if isinstance(diff, PairedDifference) else (diff or {}).get("ci95")
    if not ci or ci[0] is None or ci[1] is None:
        return "no data"
    if ci[1] < 0:
        return "lower"
    if ci[0] > 0:
        return "higher"
    return "no claim"


def cell_analysis(trajectories: list, attempts: int) -> dict[str, Any]:
    """One cell's record (summary metrics and triage) and, kept apart for the paired comparisons,
    its per-task score and per-task share of valid episodes ending in each failure class. A cell
    is one harness's episodes."""
    from harnessrl.metrics import harness_summary, task_scores
    from harnessrl.triage import CONTENT, PROCESS, HarnessTriage, triage_by_harness

    summary = harness_summary(trajectories, attempts)
    tri = next(iter(triage_by_harness(trajectories).values()), None) or HarnessTriage.empty()
    n_valid, counts = tri.n_valid, tri.counts
    process = sum(counts[c] for c in PROCESS)
    content = sum(counts[c] for c in CONTENT)
    record = {
        "n_tasks": summary.n_tasks,
        "n_episodes": summary.n_episodes,
        "n_infra_errors": summary.n_infra_errors,
        "attempts": attempts,
        "mean_score": summary.mean_score,
        "mean_score_ci95": summary.mean_score_ci95,
        "pass_at_k": summary.pass_at_k,
        "pass_hat_k": summary.pass_hat_k,
        "k_notes": summary.k_notes,
        "delivery_rate": summary.delivery_rate,
        "triage": {
            "n_valid": n_valid,
            "n_failed": tri.n_failed,
            "counts": {c: counts[c] for c in PROCESS + CONTENT},
            "process_share": tri.process_share,
            "content_share": tri.content_share,
            "process_rate": process / n_valid if n_valid else None,
            "content_rate": content / n_valid if n_valid else None,
        },
    }
    # per task: the share of its valid episodes whose first failure signal is each class (or kind)
    valid: dict[str, int] = defaultdict(int)
    hits: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in trajectories:
        if not t.is_infra_error:
            valid[t.task_id] += 1
    for v in tri.episodes:
        if v.kind != "infra":
            for key in {v.cls, v.kind}:  # the content class shares its name with its kind: count it once
                hits[v.task_id][key] += 1
    rates = {
        key: {task: hits[task][key] / n for task, n in valid.items()}
        for key in (*PROCESS, *CONTENT, "process", "content")
    }
    return {"record": record, "scores": task_scores(trajectories), "rates": rates}


def class_effects(analyses: dict[str, dict[str, Any]], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per failure class seen in any cell: the paired difference (by task) of its rate (share of
    valid episodes) between seed-base and evolved-base (`harness`), seed-distilled (`weights`)
    and seed-placebo (`placebo`). Negative = the class is rarer."""
    from harnessrl.metrics import paired_difference
    from harnessrl.triage import CONTENT, PROCESS

    base = analyses["seed-base"]["rates"]
    effects = {}
    for cls in (*PROCESS, *CONTENT):
        if not any(any(a["rates"][cls].values()) for a in analyses.values()):
            continue
        entry: dict[str, Any] = {"kind": "process" if cls in PROCESS else "content"}
        for name, cell in (("harness", "evolved-base"), ("weights", "seed-distilled"), ("placebo", "seed-placebo")):
            diff = paired_difference(base[cls], analyses[cell]["rates"][cls], seed=seed)
            entry[name] = {**diff.model_dump(), "verdict": verdict(diff)}
        effects[cls] = entry
    return effects


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _fmt_diff(diff: dict[str, Any]) -> str:
    ci = diff.get("ci95") or [None, None]
    if diff.get("mean_difference") is None:
        return "no shared task"
    return f"{diff['mean_difference']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


# ------------------------------------------------------------------------------ the recommendation


def recommend(
    differences: dict[str, dict[str, Any]],
    effects: dict[str, Any],
    evolved_is_seed: bool = False,
    content: dict[str, Any] | None = None,
) -> Recommendation:
    """The recommendation, computed from the paired differences and the failure-class effects.

    fix_in_harness       process classes the evolved harness makes rarer (interval below 0)
    train_into_weights   content classes the distilled weights make rarer, where the placebo
                         adapter does not (a placebo that helps as much means the gain is not
                         from what the episodes showed)
    distils              classes the evolved harness removes AND the distilled weights reduce
                         under the seed harness: the weights learned what the harness enforced
    runtime_only         classes the evolved harness removes that the distilled weights do not
                         reduce (interval includes 0 or above): keep them in the harness; and the
                         score gain itself, when the harness raises the score and the weights do not
    no_claim             every effect and difference whose interval includes 0
    text                 the same, as sentences (with the content-failure rate before and after,
                         `content` as study.json's content_failures, when given)
    """
    sorted_classes, no_claim = _sort_classes(effects)
    score = _score_verdicts(differences)
    text = [
        *(
            [
                "The evolved harness is the seed harness (no edit accepted, or the same spec given): every harness "
                "effect is noise."
            ]
            if evolved_is_seed
            else []
        ),
        *_class_sentences(sorted_classes, effects),
        *([_content_sentence(content)] if content is not None else []),
        *_score_sentences(differences, score),
    ]
    return Recommendation(
        **sorted_classes,
        score=score,
        no_claim=no_claim + _score_no_claims(differences),
        text=text,
    )


def _sort_classes(effects: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The failure classes sorted by their verdicts into fix_in_harness, train_into_weights,
    distils and runtime_only (in that key order); and the class effects that claim nothing."""
    fix: list[dict[str, Any]] = []
    train: list[dict[str, Any]] = []
    distils: list[dict[str, Any]] = []
    runtime: list[dict[str, Any]] = []
    no_claim: list[dict[str, Any]] = []

    def item(cls: str, *keys: str) -> dict[str, Any]:
        e = effects[cls]
        return {"class": cls, "kind": e["kind"], **{k: {x: e[k][x] for x in ("mean_difference", "ci95")} for k in keys}}

    for cls, e in effects.items():
        h, w, p = e["harness"]["verdict"], e["weights"]["verdict"], e["placebo"]["verdict"]
        if e["kind"] == "process" and h == "lower":
            fix.append(item(cls, "harness"))
            (distils if w == "lower" else runtime).append(item(cls, "harness", "weights"))
        if e["kind"] == "content" and w == "lower":
            if p == "lower":
                no_claim.append(
                    {
                        "what": f"{cls} rate, distilled vs base under seed",
                        "ci95": e["weights"]["ci95"],
                        "why": "the placebo adapter reduces it too: not attributable to the distilled content",
                    }
                )
            else:
                train.append(item(cls, "weights", "placebo"))
        for key, label in (("harness", "evolved vs seed under base"), ("weights", "distilled vs base under seed")):
            if e[key]["verdict"] == "no claim":
                no_claim.append(
                    {"what": f"{cls} rate, {label}", "ci95": e[key]["ci95"], "why": "the 95% interval includes 0"}
                )
    sorted_classes = {"fix_in_harness": fix, "train_into_weights": train, "distils": distils, "runtime_only": runtime}
    return sorted_classes, no_claim


def _score_verdicts(differences: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The score's verdicts, and whether the harness's gain is runtime-only (the weights show none)."""
    harness = differences["evolved_vs_seed_under_base"]["verdict"]
    weights = differences["distilled_vs_base_under_seed"]["verdict"]
    return {
        "harness": harness,
        "weights": weights,
        "placebo": differences["placebo_vs_base_under_seed"]["verdict"],
        "combined": differences["evolved_distilled_vs_seed_base"]["verdict"],
        "runtime_only": harness == "higher" and weights != "higher",
    }


def _score_no_claims(differences: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"what": f"score, {LABELS[name]}", "ci95": diff["ci95"], "why": "the 95% interval includes 0"}
        for name, diff in differences.items()
        if diff["verdict"] == "no claim"
    ]


def _class_sentences(sorted_classes: dict[str, list[dict[str, Any]]], effects: dict[str, Any]) -> list[str]:
    """The sentences on the failure classes: fix in the harness, train into the weights, distils,
    runtime-only, and the process classes only the weights make rarer."""
    fix, train = sorted_classes["fix_in_harness"], sorted_classes["train_into_weights"]
    distils, runtime = sorted_classes["distils"], sorted_classes["runtime_only"]
    text = []
    if fix:
        text.append(
            "Fix in the harness: "
            + "; ".join(f"{x['class']} ({_fmt_diff(x['harness'])})" for x in fix)
            + " (process failures the evolved harness makes rarer)."
        )
    else:
        text.append("Fix in the harness: no process failure class is significantly rarer under the evolved harness.")
    if train:
        text.append(
            "Train into the weights: "
            + "; ".join(f"{x['class']} ({_fmt_diff(x['weights'])}; placebo {_fmt_diff(x['placebo'])})" for x in train)
            + " (content failures the distilled weights make rarer under the seed harness, the placebo does not)."
        )
    else:
        text.append(
            "Train into the weights: no content failure class is significantly rarer with the distilled weights."
        )
    if distils:
        text.append(
            "Distils: " + ", ".join(x["class"] for x in distils) + " (removed by the harness and by the weights)."
        )
    if runtime:
        text.append(
            "Runtime-only (keep in the harness, it does not distil): "
            + "; ".join(
                f"{x['class']} (distilled weights under the seed harness: {_fmt_diff(x['weights'])})" for x in runtime
            )
            + ". Where that interval includes 0 there is no claim either way: the weights did not measurably learn it."
        )
    also = [
        cls
        for cls, e in effects.items()
        if e["kind"] == "process" and e["weights"]["verdict"] == "lower" and e["harness"]["verdict"] != "lower"
    ]
    if also:
        text.append(
            "The distilled weights also make these process failures rarer under the seed harness, which the evolved "
            "harness did not: " + "; ".join(f"{cls} ({_fmt_diff(effects[cls]['weights'])})" for cls in also) + "."
        )
    return text


def _content_sentence(content: dict[str, Any]) -> str:
    before, after, diff = content["before"], content["after"], content["rate_difference"]
    claim = {"lower": "fewer", "higher": "more"}.get(diff["verdict"], "the interval includes 0, no claim")
    return (
        f"Content failures, as a share of episodes: {_pct(before['content_rate'])} with the base weights, "
        f"{_pct(after['content_rate'])} with the distilled weights (seed harness); paired by task "
        f"{_fmt_diff(diff)}: {claim}."
    )


def _score_sentences(differences: dict[str, dict[str, Any]], score: dict[str, Any]) -> list[str]:
    """The sentences on the score: a runtime-only harness gain, each difference, a placebo that helps."""
    text = []
    if score["runtime_only"]:
        text.append(
            f"The evolved harness's score gain ({_fmt_diff(differences['evolved_vs_seed_under_base'])}) is "
            "runtime-only: the distilled weights under the seed harness show "
            f"{_fmt_diff(differences['distilled_vs_base_under_seed'])}."
        )
    for name, diff in differences.items():
        if diff["verdict"] in ("higher", "lower"):
            text.append(f"Score, {LABELS[name]}: {_fmt_diff(diff)} ({diff['verdict']}).")
        elif diff["verdict"] == "no claim":
            text.append(f"Score, {LABELS[name]}: {_fmt_diff(diff)}: the interval includes 0, no claim.")
    if score["placebo"] == "higher":
        text.append(
            "The placebo adapter raises the score too: part of any distilled gain is not from the answers shown."
        )
    return text


# ------------------------------------------------------------------------------ study.json's analysis


def compare_cells(analyses: dict[str, dict[str, Any]], seed: int = 0, evolved_is_seed: bool = False) -> CellComparison:
    """study.json's analysis of the cells (`cell_analysis` of each, by name): the paired score
    differences, the content-failure share before and after, the failure-class effects and the
    recommendation; `seed` seeds the bootstrap intervals."""
    from harnessrl.metrics import paired_difference

    differences = {}
    for name, (a, b) in COMPARISONS.items():
        diff = paired_difference(analyses[a]["scores"], analyses[b]["scores"], seed=seed)
        differences[name] = {"a": a, "b": b, **diff.model_dump(), "verdict": verdict(diff)}
    before, after = analyses["seed-base"], analyses["seed-distilled"]
    content_diff = paired_difference(before["rates"]["content"], after["rates"]["content"], seed=seed)
    content = {
        "before": {"cell": "seed-base", **_shares(before["record"])},
        "after": {"cell": "seed-distilled", **_shares(after["record"])},
        "rate_difference": {**content_diff.model_dump(), "verdict": verdict(content_diff)},
    }
    effects = class_effects(analyses, seed=seed)
    return CellComparison(
        paired_differences=differences,
        content_failures=content,
        class_effects=effects,
        recommendation=recommend(differences, effects, evolved_is_seed, content),
    )


def _shares(record: dict[str, Any]) -> dict[str, Any]:
    t = record["triage"]
    return {"content_rate": t["content_rate"], "content_share": t["content_share"]}


__all__ = [
    "CELLS",
    "COMPARISONS",
    "LABELS",
    "CellComparison",
    "Recommendation",
    "cell_analysis",
    "class_effects",
    "compare_cells",
    "recommend",
    "verdict",
]
