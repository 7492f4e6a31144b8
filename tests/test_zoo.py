"""The model zoo's declared shapes: VGG with the paper's three fully-connected layers
(ADEL-FL Sec. 5: "8 and 10 convolutional layers followed by 3 fully-connected layers")."""

from __future__ import annotations

import pytest
import torch

from fedhet.config import ConfigError, from_dict
from fedhet.models import FlatModel
from fedhet.models.zoo import vgg


@pytest.mark.parametrize(("variant", "convolutions"), [("vgg11", 8), ("vgg13", 10)])
def test_the_papers_vgg_has_its_convolutions_then_three_fully_connected_layers(variant, convolutions):
    """classifier = "paper": the declared layers are the convolutions and three linear maps
    (512-512, 512-512, 512-classes); it holds two 512 x 512 maps (and biases) more than the
    one-classifier form, and maps CIFAR-sized and padded 28x28 images to class scores."""
    one, paper = vgg((3, 32, 32), 10, variant), vgg((3, 32, 32), 10, variant, "paper")
    flat_one, flat_paper = FlatModel(one), FlatModel(paper)
    assert flat_one.layout.num_layers == convolutions + 1
    assert flat_paper.layout.num_layers == convolutions + 3
    linears = [m for m in paper.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(512, 512), (512, 512), (512, 10)]
    assert flat_paper.layout.num_params - flat_one.layout.num_params == 2 * (512 * 512 + 512)
    paper.eval()
    assert paper(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    gray = vgg((1, 28, 28), 10, variant, "paper").eval()
    assert gray(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_an_unknown_vgg_classifier_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"model.classifier = 'three': unknown \(known: one, paper\)"):
        from_dict({"model": {"name": "vgg11", "classifier": "three"}})
    assert "classifier" not in from_dict({"model": {"name": "vgg11"}}).to_dict()["model"]
