"""A client's state is namespaced per component (the algorithm, the local optimizer, each
postprocessor), so two components writing the same key keep apart; stores saved before
namespacing load under their owners. The payload tensors an algorithm sends as part of its
update (SCAFFOLD's control change) go through the postprocessors with the delta and count
in the upload's bytes on the clock."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms.fedavg import FedAvg
from fedhet.client import ClientData, LocalTrainer
from fedhet.client.postprocess import ClipNoise, ClipNoiseOptions, Compress, CompressOptions, payload_bytes
from fedhet.client.state import ClientStates, Namespace, component_names
from fedhet.config import from_dict
from fedhet.engine.drivers import upload_bytes
from fedhet.engine.launch import run
from fedhet.messages import ClientTask, ClientUpdate, Coverage
from fedhet.models import FlatModel, build_model
from fedhet.world import build_world

BASE = {
    "run": {"name": "ns", "seed": 2, "rounds": 2, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 3, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "system": {"model": "full"},
}


class KeepsMomentum(FedAvg):
    """Writes a key that the SGD optimizer also writes: ``momentum``."""

    def finish_local_work(self, task, update, state, region, local, anchor):
        state["momentum"] = torch.full((3,), float(task.round))


def test_the_algorithm_and_the_optimizer_writing_the_same_key_keep_apart(tmp_path):
    document = {
        **BASE,
        "algorithm": {"name": "test_client_state:KeepsMomentum"},
        "train": {"momentum": 0.9, "keep_momentum": True, "local_steps": 2},
    }
    result = run(from_dict(document), tmp_path / "r")
    saved = torch.load(result.path / "checkpoint.pt", weights_only=False)["client_states"]
    for store in saved.values():
        assert set(store) == {"algorithm/momentum", "optimizer/momentum"}
        last = float(store["algorithm/momentum"][0])  # the round the client last trained in
        assert last in (1.0, 2.0) and torch.equal(store["algorithm/momentum"], torch.full((3,), last))
        assert store["optimizer/momentum"].numel() == sum(
            p.numel() for p in build_model("mlp", (1, 8, 8), 10, [8]).parameters()
        )


def test_a_component_sees_only_its_own_part():
    store = {"algorithm/control": torch.ones(2), "optimizer/momentum": torch.zeros(2)}
    own = Namespace(store, "algorithm")
    assert list(own) == ["control"] and len(own) == 1 and "momentum" not in own
    assert own.get("momentum") is None and own.pop("absent", None) is None
    own["momentum"] = torch.full((2,), 5.0)
    assert torch.equal(store["optimizer/momentum"], torch.zeros(2))  # untouched
    assert set(store) == {"algorithm/control", "algorithm/momentum", "optimizer/momentum"}
    assert component_names(["compress", "clip-noise", "compress"]) == ["compress", "clip-noise", "compress.2"]


def test_a_store_saved_before_namespacing_loads_under_its_owners():
    states = ClientStates()
    old = {
        "control": torch.ones(2),
        "momentum": torch.zeros(2),
        "adam.steps": torch.zeros(2),
        "compress.residual": torch.ones(1),
    }
    states.load_state_dict({4: old})
    assert set(states.of(4)) == {
        "algorithm/control",
        "optimizer/momentum",
        "optimizer/adam.steps",
        "compress/compress.residual",
    }
    assert torch.equal(states.part(4, "algorithm")["control"], torch.ones(2))


def test_two_postprocessors_of_one_kind_keep_their_own_residuals():
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10, [16]))
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    chain = [
        Compress(CompressOptions(method="topk", fraction=0.5, error_feedback=True)),
        Compress(CompressOptions(method="topk", fraction=0.1, error_feedback=True)),
    ]
    store: dict = {}
    LocalTrainer(flat, postprocessors=chain).execute(
        ClientTask(0, 0, 0.05, 16, 2, Coverage(1)),
        flat.params.clone(),
        flat.buffers.clone(),
        ClientData(x, y, np.arange(16)),
        store,
        np.random.default_rng(0),
    )
    assert set(store) == {"compress/compress.residual", "compress.2/compress.residual"}
    assert not torch.equal(store["compress/compress.residual"], store["compress.2/compress.residual"])


# -- payload vectors: processed and counted -----------------------------------------------------


def _scaffold_update() -> ClientUpdate:
    generator = torch.Generator().manual_seed(0)
    update = ClientUpdate(0, Coverage(1), 2, 10, 0.1, torch.randn(200, generator=generator))
    update.payload = {"control_change": 30 * torch.randn(200, generator=generator), "k": 2}
    update.wire = ("control_change",)
    return update


def test_clipping_bounds_the_whole_update_payload_included():
    update = ClipNoise(ClipNoiseOptions(max_norm=1.0)).process(_scaffold_update(), {}, torch.Generator())
    whole = torch.cat([update.delta, update.payload["control_change"]])
    assert float(whole.norm()) == pytest.approx(1.0, rel=1e-5)
    assert update.payload["k"] == 2  # scalars are metadata: untouched


def test_compression_compresses_each_vector_and_keeps_a_residual_for_each():
    state: dict = {}
    compress = Compress(CompressOptions(method="topk", fraction=0.05, error_feedback=True))
    before = _scaffold_update()
    after = compress.process(_scaffold_update(), state, torch.Generator())
    assert int((after.delta != 0).sum()) == 10 and int((after.payload["control_change"] != 0).sum()) == 10
    assert set(state) == {"compress.residual", "compress.residual.control_change"}
    assert torch.allclose(
        after.payload["control_change"] + state["compress.residual.control_change"],
        before.payload["control_change"],
    )


def test_scaffold_uploads_twice_the_model_and_compression_covers_both_halves():
    plain = build_world(from_dict({**BASE, "algorithm": {"name": "fedavg"}}))
    scaffold = build_world(from_dict({**BASE, "algorithm": {"name": "scaffold"}}))
    int8 = build_world(
        from_dict(
            {
                **BASE,
                "algorithm": {"name": "scaffold"},
                "train": {"postprocess": [{"name": "compress", "method": "int8"}]},
            }
        )
    )
    depths = np.ones(3, dtype=int)
    params = plain.worker.flat.params.numel()
    assert (upload_bytes(plain, depths) == 4 * params).all()
    assert (upload_bytes(scaffold, depths) == 2 * 4 * params).all()
    assert (upload_bytes(int8, depths) == 2 * payload_bytes(int8.worker.postprocessors, params)).all()
    assert payload_bytes(int8.worker.postprocessors, params) == params + 4


def test_a_scaffold_run_compresses_its_control_change(tmp_path):
    """Trained through the real trainer: with top-k on, every Delta c_i the server receives
    has exactly k non-zero elements."""
    document = {
        **BASE,
        "algorithm": {"name": "scaffold"},
        "run": {**BASE["run"], "rounds": 1},
        "train": {"local_steps": 2, "postprocess": [{"name": "compress", "method": "topk", "fraction": 0.1}]},
    }
    world = build_world(from_dict(document))
    flat = world.worker.flat
    task = world.algorithm.make_task(
        world.algorithm.plan(1, world.algorithm.init_state(world.setting()), world.system, None),
        0,
        2,
        Coverage(1),
        world.algorithm.init_state(world.setting()),
    )
    update = world.worker.execute(
        task,
        flat.params.clone(),
        flat.buffers.clone(),
        world.client_data(0),
        {},
        np.random.default_rng(0),
        world.algorithm,
    )
    k = int(np.ceil(0.1 * flat.params.numel()))
    assert update.wire == ("control_change",)
    assert int((update.payload["control_change"] != 0).sum()) == k
    assert int((update.delta != 0).sum()) == k
