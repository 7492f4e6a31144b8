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


def test_fedstales_cifar_cnn_has_its_four_layers_and_parameter_total():
    """cnn-fedstale-cifar (FedStale's CIFAR-10 CNN): conv 3->32 5x5 (2,432 parameters), conv
    32->64 5x5 (51,264), fc 1,600->2,048 (3,278,848), fc 2,048->10 (20,490): four declared
    layers, 3,353,034 parameters; 32x32 RGB images give 10 scores, and images too small for
    two 5x5 convolutions and pools are refused in one line."""
    config = from_dict({"model": {"name": "cnn-fedstale-cifar"}})
    from fedhet.models import build_model

    model = build_model(config.model.name, (3, 32, 32), 10)
    flat = FlatModel(model)
    assert flat.layout.num_layers == 4
    per_layer = [end - start for start, end in flat.layout.param_slices.bounds]
    assert per_layer == [2432, 51264, 3278848, 20490] and flat.layout.num_params == 3_353_034
    assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ConfigError, match="cnn-fedstale-cifar' needs images of at least 16x16, got 8x8"):
        build_model("cnn-fedstale-cifar", (3, 8, 8), 10)
