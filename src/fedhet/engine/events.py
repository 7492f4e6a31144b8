"""The event-driven driver on the virtual clock, for asynchronous algorithms (FedBuff).

Clients train continuously: a client started at simulated time t on model version v
delivers at t + its full local work's time (from the system model, a draw per start), and
is then idle. The algorithm decides which idle clients start (up to its concurrency) and how
a full buffer becomes a server step; each server step is one row of metrics.csv (``round``
= server steps so far, ``round_time`` = time since the previous step). A client computes its
update when it starts, on the model it was sent, with its own stream (seed, its start count,
client); the in-flight updates, the buffer and the start counts are checkpointed, so a
resumed run continues exactly.
"""

from __future__ import annotations

import numpy as np

from fedhet import seeding
from fedhet.engine.faults import NonFinite, params_fault, update_fault
from fedhet.engine.records import metrics_row
from fedhet.errors import FedhetError
from fedhet.messages import ClientTask, Coverage
from fedhet.system.outcomes import Workload


class EventDriver:
    """Advances a run from one server step to the next (the Simulator's ``_round``)."""

    def __init__(self, simulator):
        self.sim = simulator

    def _engine_state(self, state, num_clients: int) -> dict:
        if not state.engine:
            state.engine = {"in_flight": [], "buffer": [], "starts": [0] * num_clients, "dispatches": 0}
        return state.engine

    def _start_clients(self, world, clients, state, now: float, version: int) -> None:
        """Fill the free concurrency with idle clients, on the current model."""
        engine, algorithm, config = state.engine, world.algorithm, self.sim.config
        busy = {entry["client"] for entry in engine["in_flight"]}
        idle = [c for c in range(world.num_clients) if c not in busy]
        free = algorithm.concurrency(world.num_clients) - len(busy)
        if free <= 0 or not idle:
            return
        rng = seeding.round_stream(config.run.seed, "dispatch", engine["dispatches"])
        engine["dispatches"] += 1
        batch = np.full(world.num_clients, config.train.batch_size)
        steps = np.full(world.num_clients, config.train.local_steps)
        for client in algorithm.choose(idle, free, rng):
            start = engine["starts"][client]
            task = ClientTask(
                round=start,
                client=client,
                lr=algorithm.lr_at(version),
                batch_size=config.train.batch_size,
                local_steps=config.train.local_steps,
                coverage=Coverage(1),
                deadline=None,
                model_round=version,
            )
            updates = clients.run([task], state.params, state.buffers, state.clients)
            timing = world.system.sample(
                Workload(None, batch, steps, start_time=now),
                seeding.client_stream(config.run.seed, start, client, "duration"),
            )
            engine["starts"][client] = start + 1
            if not updates or not timing.participates[client]:
                continue  # absent (or failed): idle again, tried at the next start
            engine["in_flight"].append(
                {"client": client, "time": now + float(timing.full_time[client]), "version": version,
                 "update": updates[0]}
            )  # fmt: skip

    def round(self, world, clients, clock, evaluator, state, t: int):
        """Process arrivals until the next server step: its metrics row, a NonFinite fault,
        or None when the next arrival would pass the time budget."""
        engine = self._engine_state(state, world.num_clients)
        algorithm, k = world.algorithm, world.algorithm.options.buffer_size
        self._start_clients(world, clients, state, state.engine.get("now", state.sim_time), t)
        while True:
            if not engine["in_flight"]:
                raise FedhetError(f"{algorithm.name}: no client could be started (all absent or failed)")
            arrival = min(engine["in_flight"], key=lambda e: (e["time"], e["client"]))
            if not clock.fits(arrival["time"] - state.sim_time):
                return None
            engine["in_flight"].remove(arrival)
            engine["now"] = arrival["time"]
            engine["buffer"].append((arrival["update"], t - arrival["version"]))
            if len(engine["buffer"]) >= k:
                break
            if not any(e["time"] == engine["now"] for e in engine["in_flight"]):
                # idle clients start once every arrival of this instant is in
                self._start_clients(world, clients, state, engine["now"], t)
        entries, engine["buffer"] = engine["buffer"], []
        for update, _ in entries:
            if what := update_fault(update):
                return NonFinite(t + 1, update.client, what)
        params, buffers = algorithm.apply_buffer(state.params, state.buffers, entries, state.algorithm, t)
        if what := params_fault(params, buffers):
            return NonFinite(t + 1, None, what)
        state.params, state.buffers = params, buffers
        duration = engine["now"] - state.sim_time
        state.sim_time = clock.advance(duration)
        updates = [u for u, _ in entries]
        row = metrics_row(t + 1, state.sim_time, duration, None, algorithm.lr_at(t), updates, np.array([]))
        if evaluator.due(t + 1):
            self.sim._evaluate(world, evaluator, state, row)
        return row
