"""Postprocessors own one vectorised step over a group of updates: a group's result equals
each update postprocessed alone, bit for bit (each client's draws come from its own
generator, its error-feedback residual from its own state); a plug-in postprocessor that
writes only ``process`` is applied to each update of a group in turn."""

from __future__ import annotations

import copy

import pytest
import torch

from fedhet.client.postprocess import ClipNoise, ClipNoiseOptions, Compress, CompressOptions, Postprocessor
from fedhet.messages import ClientUpdate, Coverage


def _updates(count: int, size: int = 300, payload: int = 40) -> list[ClientUpdate]:
    generator = torch.Generator().manual_seed(7)
    out = []
    for client in range(count):
        update = ClientUpdate(client, Coverage(1), 2, 10, 0.5, torch.randn(size, generator=generator))
        update.payload["control"] = torch.randn(payload, generator=generator) * (client + 1)
        update.wire = ("control",)
        out.append(update)
    out[1].delta.zero_()  # a zero update: sent as it is (norm 0, int8 scale 0)
    return out


def _generators(count: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(100 + i) for i in range(count)]


CHAIN = {
    "clip-noise": lambda: ClipNoise(ClipNoiseOptions(max_norm=2.0, noise_multiplier=0.5)),
    "int8": lambda: Compress(CompressOptions(method="int8", error_feedback=True)),
    "topk": lambda: Compress(CompressOptions(method="topk", fraction=0.05, error_feedback=True)),
}


@pytest.mark.parametrize("name", sorted(CHAIN))
def test_a_groups_step_equals_each_update_alone_bit_for_bit(name):
    step = CHAIN[name]()
    grouped, alone = _updates(4), _updates(4)
    group_states = [{"compress.residual": torch.randn(350)} if i == 2 else {} for i in range(4)]
    alone_states = copy.deepcopy(group_states)
    for _ in range(2):  # a second round reads the residuals the first one kept
        grouped = step.process_group(grouped, group_states, _generators(4))
        alone = [step.process(u, s, g) for u, s, g in zip(alone, alone_states, _generators(4), strict=True)]
    for mine, theirs in zip(grouped, alone, strict=True):
        assert torch.equal(mine.delta, theirs.delta)
        assert torch.equal(mine.payload["control"], theirs.payload["control"])
    for mine, theirs in zip(group_states, alone_states, strict=True):
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    if name == "clip-noise":  # the whole update clipped: without noise its norm would be <= C
        assert not torch.equal(grouped[0].delta, _updates(4)[0].delta)


def test_an_update_without_local_work_passes_every_step_untouched():
    updates = _updates(2)
    updates[0] = ClientUpdate(0, Coverage(3), 0, 10, 0.0, torch.zeros(0))
    for make in CHAIN.values():
        out = make().process_group(updates, [{}, {}], _generators(2))
        assert out[0].delta.numel() == 0 and out[0].steps == 0


def test_a_plugin_writing_only_process_is_applied_to_each_update_of_a_group():
    class Halve(Postprocessor):
        name = "halve"

        def process(self, update, state, generator):
            update.set_vector("delta", update.delta / 2)
            state["calls"] = torch.ones(1)
            return update

    updates, before = _updates(3), [u.delta.clone() for u in _updates(3)]
    states: list[dict] = [{}, {}, {}]
    out = Halve().process_group(updates, states, _generators(3))
    assert all(torch.equal(u.delta, b / 2) for u, b in zip(out, before, strict=True))
    assert all("calls" in s for s in states)
    with pytest.raises(NotImplementedError, match="write process or process_group"):
        Postprocessor().process(updates[0], {}, _generators(1)[0])
