"""What a run reports: one metrics row per round and the summary at the end."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedhet.build import fedhet_build
from fedhet.data.task import Score
from fedhet.engine.evaluation import target_times
from fedhet.engine.traffic import traffic_totals
from fedhet.messages import ClientUpdate, UpdateSummary
from fedhet.run_schema import higher_is_better


def metrics_row(
    round_number: int,
    sim_time: float,
    duration: float,
    deadline: float | None,
    lr: float,
    updates: Sequence[ClientUpdate | UpdateSummary],
    depths: np.ndarray,
    skipped: int = 0,
    faults: int = 0,
    metric_names: Sequence[str] = ("loss", "accuracy"),
) -> dict:
    """A metrics.csv row (test columns filled by the evaluator when due). ``depths``: the
    sampled depths of the asked, present clients; ``skipped``: clients whose non-finite
    update was left out (``run.on_non_finite = "skip-client"``); ``faults``: clients whose
    update was not delivered (a dead worker, a lost node, a client error skipped);
    ``metric_names``: the task's, one ``test_<metric>`` column each."""
    trained = [u.loss for u in updates if u.steps > 0]
    return {
        "round": round_number,
        "sim_time": sim_time,
        "round_time": duration,
        "deadline": deadline,
        "participants": sum(1 for u in updates if u.steps > 0),
        "skipped": skipped,
        "mean_depth": float(np.mean(depths)) if len(depths) else None,
        "mean_steps": float(np.mean([u.steps for u in updates])) if updates else None,
        "lr": lr,
        "train_loss": float(np.mean(trained)) if trained else None,
        **{f"test_{name}": None for name in metric_names},
        "faults": faults,
    }


BUDGET_STOPS = ("time_budget", "energy_budget", "epsilon_budget")  # a run they stop has finished


def run_summary(config, world, state, notes: list[str]) -> dict:
    """summary.json: the run's identity, length, clock and the task's metrics: the final
    and best value of each (best in its score's direction), the best round by the score."""
    task, score = world.dataset.task, Score.of(world.dataset.task)
    evaluated = [r for r in state.metrics if r.get("test_loss") is not None]
    scored = [r for r in evaluated if r.get(score.column) is not None]
    best = score.best(r[score.column] for r in scored)
    best_row = next((r for r in scored if r[score.column] == best), None)
    knowledge = getattr(world.algorithm, "planner_knowledge", None)  # a rule that plans from speeds
    return {
        **({"planner_knowledge": knowledge} if knowledge else {}),
        "name": config.run.name,
        "algorithm": config.algorithm_name,
        "engine": config.run.engine,
        "algorithm_options": config.algorithm_options,
        "dataset": config.data.dataset,
        "data_source": dict(world.dataset.provenance) or None,
        "evaluated_on": "validation" if config.data.validation_fraction else "test",
        "model": config.model.name,
        "system": config.system.model,
        "straggler_ratio": config.system.get("straggler_ratio"),
        "num_clients": world.num_clients,
        "num_layers": world.flat.num_layers,
        "num_params": int(world.initial_params.numel()),
        "seed": config.run.seed,
        "rounds": state.round,
        "sim_time": state.sim_time,
        "wall_time": state.wall_time,
        "task": task.name,
        "score": score.to_dict(),
        "final_test_accuracy": None,  # present for every task (None without accuracy), as before
        "best_test_accuracy": None,
        **_task_metrics(task, evaluated),
        "best_round": int(best_row["round"]) if best_row else None,
        "time_budget": config.run.time_budget or None,
        "energy": float(sum(state.energy.get("joules", ()))),  # joules, all clients (fedhet.system.energy)
        # an event-driven run's starts after its last server step, charged when they started
        # (clients.csv and energy count them; no metrics row does): energy = rows + this
        "energy_in_flight": float(state.engine.get("joules", 0.0)) if state.engine else 0.0,
        "energy_budget": config.run.energy_budget or None,
        **traffic_totals(state.energy),  # bytes up and down, training FLOPs, all clients
        "stopped_by": state.stopped_by or ("rounds" if state.round >= config.run.rounds else None),
        "finished": state.round >= config.run.rounds or state.stopped_by in BUDGET_STOPS,
        "mean_round_time": state.sim_time / state.round if state.round else None,
        "empty_rounds": sum(1 for r in state.metrics if not r.get("participants")),
        "targets": target_times(state.metrics, config.run.targets, score),
        f"final_client_{score.metric}": final_client_scores(state.client_metrics, score),
        "notes": notes,
        "fedhet": fedhet_build(),
    }


def _task_metrics(task, evaluated: list[dict]) -> dict:
    """``final_test_<m>`` and ``best_test_<m>`` for each of the task's metrics; best in the
    score's direction for the score, lowest for a loss or error, highest for an accuracy."""
    out: dict = {}
    for name in task.metric_names():
        values = [r[f"test_{name}"] for r in evaluated if r.get(f"test_{name}") is not None]
        higher = higher_is_better(f"final_test_{name}", task)  # the task says; else the built-in tasks
        out[f"final_test_{name}"] = values[-1] if values else None
        out[f"best_test_{name}"] = Score(name, higher).best(values)
    return out


def final_client_scores(rows: list[dict], score: Score) -> dict[str, float | None] | None:
    """Each client's score at the last evaluation (``None`` without run.client_eval)."""
    if not rows:
        return None
    last = max(r["round"] for r in rows)
    return {str(r["client"]): r.get(score.metric) for r in rows if r["round"] == last}
