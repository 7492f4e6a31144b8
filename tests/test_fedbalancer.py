"""FedBalancer (Shin et al., MobiSys 2022): clients train on the samples over the loss
threshold (Algorithm 1), the server sets the deadline where the most clients finish per
second (Algorithm 4) and moves the threshold and deadline ratios with the loss trend
(Algorithms 2-3). Checked by hand on the selection and the deadline, on a run whose second
deadline is computed here, on the clock's charge for the loss evaluation, and for a
bit-identical resume."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_fedbuff import _config

from fedhet.algorithms.fedbalancer import peak_deadline, select_samples
from fedhet.config import ConfigError
from fedhet.engine.loop import RunLoop
from fedhet.errors import FedhetError

LOSSES = np.array([0.1, 0.2, 0.5, 0.9, 1.5, 2.0])  # threshold 0.6: UT = {0, 1, 2}, OT = {3, 4, 5}


@pytest.mark.parametrize(
    ("capacity", "share", "under", "over"),
    [
        (np.inf, 0.0, 3, 3),  # all fit: every sample
        (4, 0.5, 2, 2),  # OT fits: as many as fit, half from UT
        (4, 0.0, 1, 3),  # none asked from UT, but OT has only 3: the fourth comes from UT
        (2, 0.0, 0, 3),  # OT does not fit: |OT| samples, all from OT
        (2, 0.5, 1, 2),  # |OT| = 3 samples, int(1.5) = 1 from UT
    ],
)
def test_sample_selection_follows_algorithm_1(capacity, share, under, over):
    chosen = select_samples(LOSSES, 0.6, capacity, share, np.random.default_rng(0))
    assert len(set(chosen.tolist())) == len(chosen)
    assert (np.sum(chosen < 3), np.sum(chosen >= 3)) == (under, over)


def test_the_peak_deadline_maximises_completions_per_second():
    # 1/1, 2/2, 3/2.5, 4/10 clients per second: the peak is at 2.5
    assert peak_deadline(np.array([10.0, 2.5, 1.0, 2.0])) == 2.5
    assert peak_deadline(np.array([np.nan, np.nan])) == np.inf


# four clients of capabilities 1.5, 1.5, 0.75 and 0.25 (mean 1): a step of batch 8 takes
# 2/3, 2/3, 4/3 and 4 s; two steps; the loss evaluation pipelined (free)
RUN = {
    "run": {"rounds": 3},
    "train": {"local_steps": 2},
    "system": {"model": "per-step", "time_per_sample_step": 0.125, "capability_profile": "list",
               "capabilities": [1.5, 1.5, 0.75, 0.25], "deadline": 3.0},
    "algorithm": {"name": "fedbalancer", "inference": "pipelined"},
}  # fmt: skip


def test_the_deadline_moves_to_the_peak_once_half_the_clients_reported(tmp_path):
    """Round 1 runs at the configured 3 s (clients 0-2 finish, 3 needs 8 s). Every client
    reported its pace, so round 2's deadline is D_low + (D_high - D_low) x 1 = D_high: the
    full work's completion times 4/3, 4/3, 8/3, 8 give 0.75, 1.5, 1.125, 0.5 clients a
    second, a peak at 4/3. Client 2 then has room for floor((4/3) / (4/3)) = 1 step, so it
    is planned one step and still finishes; client 3 (4 s a step) does not."""
    result = RunLoop(_config(**RUN), tmp_path / "r").run()
    log = json.loads((tmp_path / "r" / "fedbalancer.json").read_text())["rounds"]
    assert log[0]["deadline"] == 3.0
    assert log[1]["deadline"] == pytest.approx(4 / 3)
    assert [r["clients"] for r in log] == [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
    assert [r["round_time"] for r in result.metrics] == pytest.approx([3.0, 4 / 3, 4 / 3])


def test_fedbalancer_needs_a_system_model_with_time(tmp_path):
    """On a depth-only model the clients' times are defined by the deadline, so a deadline
    set from them only shrinks with itself (it fell to 1e-52 s in a bench): refused."""
    system = {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 0.2}
    with pytest.raises(ConfigError, match="'fedbalancer' plans against time.*no time law"):
        RunLoop(_config(**{**RUN, "system": system}), tmp_path / "x").run()


def test_the_loss_evaluation_is_charged_on_the_clock(tmp_path):
    """Charged, evaluating n = 144 losses costs ceil(144 / 24) = 6 more steps: client 2's
    round-1 work is 8 x 4/3 s, past a 6 s deadline it meets (8/3 s) when the evaluation is
    free; clients 0 and 1 (8 x 2/3 s) still make it."""
    document = {**RUN, "system": {**RUN["system"], "deadline": 6.0}, "run": {"rounds": 1}}
    free = RunLoop(_config(**document), tmp_path / "free").run()
    charged_doc = {**document, "algorithm": {"name": "fedbalancer", "inference": "charged"}}
    charged = RunLoop(_config(**charged_doc), tmp_path / "charged").run()
    assert free.metrics[0]["participants"] == 3 and charged.metrics[0]["participants"] == 2


def test_a_fedbalancer_run_resumes_bit_identically(tmp_path):
    config = _config(
        run={"rounds": 8},
        train={"local_steps": 3},
        system={"model": "per-step", "time_per_sample_step": 0.05, "capability_profile": "uniform",
                "comm_time": 0.1, "step_jitter": 0.2, "deadline": 5.0},
        algorithm={"name": "fedbalancer", "window": 2},
    )  # fmt: skip
    whole = RunLoop(config, tmp_path / "whole").run()
    RunLoop(config, tmp_path / "cut").run(stop_after=3)
    assert RunLoop(config, tmp_path / "cut").run(resume=True).metrics == whole.metrics
    report = "fedbalancer.json"
    assert (tmp_path / "cut" / report).read_text() == (tmp_path / "whole" / report).read_text()


@pytest.mark.parametrize(
    ("options", "key"),
    [({"under_share": 1.5}, "under_share"), ({"window": 0}, "window"),
     ({"threshold_step": -0.1}, "threshold_step"), ({"deadline_step": 2.0}, "deadline_step"),
     ({"low_share": 0.0}, "low_share"), ({"inference": "x"}, "inference")],
)  # fmt: skip
def test_bad_fedbalancer_options_are_refused(options, key):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _config(algorithm={"name": "fedbalancer", **options})


def test_a_deadline_the_loss_evaluation_alone_misses_is_refused_naming_it(tmp_path):
    """Charged, evaluating 144 losses is 6 more steps: with a 2 s deadline no client can
    finish (the fastest needs 8 x 2/3 s), and the refusal counts the evaluation."""
    document = {**RUN, "system": {**RUN["system"], "deadline": 2.0},
                "algorithm": {"name": "fedbalancer", "inference": "charged"}}  # fmt: skip
    with pytest.raises(FedhetError, match=r"needs 5\.33 s for all its work after its extra evaluations"):
        RunLoop(_config(**document), tmp_path / "r").run()


def test_the_loss_pass_gathers_a_clients_examples_once(tmp_path):
    """The sample-loss pass's chunks (each client's examples in order, images decoded) are
    kept per client and used again at its next task while its index array is the same one;
    another index array (another run's client in a cohort) is gathered anew."""
    config = _config(
        run={"rounds": 3},
        system={"model": "per-step", "time_per_sample_step": 0.05, "comm_time": 0.1, "deadline": 5.0},
        algorithm={"name": "fedbalancer", "inference": "pipelined"},
    )
    loop = RunLoop(config, tmp_path / "run")
    loop.run()
    world = loop.world
    trainer = world.worker
    assert set(trainer._loss_chunks) == set(range(world.num_clients))
    for client in range(world.num_clients):
        data = world.client_data(client)
        kept = trainer._loss_chunks[client][1]  # from the run's tasks
        chunks = trainer._loss_pass_chunks(client, data)
        assert chunks is kept  # used again, not gathered again
        assert torch.equal(torch.cat([x for x, _ in chunks]), data.x[data.indices])
        assert torch.equal(torch.cat([y for _, y in chunks]), data.y[data.indices])
        other = replace(data, indices=data.indices.copy())
        again = trainer._loss_pass_chunks(client, other)
        assert again is not chunks and torch.equal(torch.cat([x for x, _ in again]), data.x[data.indices])
