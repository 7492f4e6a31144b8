"""The model zoo; every model is a :class:`LayeredModel` with declared layers.

- ``mlp``: Linear layers with ReLU, hidden sizes (32, 16) by default (SALF Sec. IV-A).
- ``cnn2``: conv 1->6 5x5, pool, conv 6->6 5x5, pool, fc ->50, fc ->classes (SALF Sec. IV-A).
- ``cnn-fedstale``: conv 1->32 3x3 pad 1, pool, conv 32->64 3x3 pad 1, pool, fc ->128, fc.
- ``linear``: one linear map (no bias unless ``bias = true``).
- ``cnn-fedstale-cifar``: FedStale's CIFAR-10 CNN, conv ->32 5x5, pool, conv 32->64 5x5, pool,
  fc ->2048, fc (3,353,034 parameters for 32x32 RGB images and 10 classes).
- ``simple-cnn``: pfl-research's benchmark CNN, conv ->32 3x3, conv 32->64 3x3, pool, fc ->128, fc.
- ``vgg11/13/16/19``: 3x3 conv + BatchNorm + ReLU blocks, max-pool after each stage, one
  Linear(512, classes) classifier (``classifier = "one"``), or three fully-connected
  layers 512-512-512-classes with ReLU (``classifier = "paper"``: ADEL-FL Sec. 5's "8 and 10
  convolutional layers followed by 3 fully-connected layers"; the paper gives no widths,
  512 is the CIFAR form's); 28x28 inputs are zero-padded to 32x32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.layers import LayeredModel
from fedhet.models.pooling import MaxPool2x2
from fedhet.registry import NoOptions, register

VGG_STAGES: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}  # fmt: skip


def _image_shape(input_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(f"model.name = {model!r} needs image input, dataset gives {tuple(input_shape)}")
    return int(input_shape[0]), int(input_shape[1]), int(input_shape[2])


MAX_PARAMETERS = 200_000_000  # 800 MB of float32 weights, before gradients and copies


def mlp(input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (32, 16)) -> LayeredModel:
    """Fully connected network ``in -> hidden... -> classes``, one layer per Linear."""
    sizes = [1]
    for s in input_shape:
        sizes[0] *= int(s)
    sizes += [int(h) for h in hidden]
    count = sum((a + 1) * b for a, b in zip(sizes, [*sizes[1:], num_classes], strict=True))
    if count > MAX_PARAMETERS:
        raise ConfigError(
            f"model.hidden = {list(hidden)}: {count:,} parameters; at most {MAX_PARAMETERS:,} are allowed"
        )
    blocks: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        parts: list[nn.Module] = [nn.Flatten()] if i == 0 else []
        parts += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
        blocks.append(nn.Sequential(*parts))
    last: list[nn.Module] = [nn.Flatten()] if not blocks else []
    blocks.append(nn.Sequential(*last, nn.Linear(sizes[-1], num_classes)))
    return LayeredModel(blocks)


def cnn2(input_shape: Sequence[int], num_classes: int) -> LayeredModel:
    """SALF's CNN: conv(->6, 5x5)-pool-conv(6->6, 5x5)-pool-fc(->50)-fc(->classes)."""
    channels, height, width = _image_shape(input_shape, "cnn2")
    h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    if h < 1 or w < 1:
        raise ConfigError(f"model.name = 'cnn2' needs images of at least 16x16, got {height}x{width}")
    return LayeredModel(
        [
            nn.Sequential(nn.Conv2d(channels, 6, 5), nn.ReLU(), MaxPool2x2()),
            nn.Sequential(nn.Conv2d(6, 6, 5), nn.ReLU(), MaxPool2x2()),
            nn.Sequential(nn.Flatten(), nn.Linear(6 * h * w, 50), nn.ReLU()),
            nn.Sequential(nn.Linear(50, num_classes)),
        ]
    )


def cnn_fedstale(input_shape: Sequence[int], num_classes: int) -> LayeredModel:
    """FedStale's CNN: conv(->32, 3x3, pad 1)-pool-conv(32->64)-pool-fc(->128)-fc."""
    channels, height, width = _image_shape(input_shape, "cnn-fedstale")
    h, w = height // 4, width // 4
    if h < 1 or w < 1:
        raise ConfigError(f"model.name = 'cnn-fedstale' needs images of at least 4x4, got {height}x{width}")
    return LayeredModel(
        [
            # max-pool before ReLU: the same function (ReLU is monotone, so they commute) with a
            # 4x smaller ReLU; about 8% less compute per step on a CPU
            nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), MaxPool2x2(), nn.ReLU()),
            nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), MaxPool2x2(), nn.ReLU()),
            nn.Sequential(nn.Flatten(), nn.Linear(64 * h * w, 128), nn.ReLU()),
            nn.Sequential(nn.Linear(128, num_classes)),
        ]
    )


def cnn_fedstale_cifar(input_shape: Sequence[int], num_classes: int) -> LayeredModel:
    """FedStale's CIFAR-10 CNN (the authors' ``Cifar10CNN``): conv(->32, 5x5)-ReLU-pool-
    conv(32->64, 5x5)-ReLU-pool-fc(->2048)-ReLU-fc(->classes), no padding."""
    channels, height, width = _image_shape(input_shape, "cnn-fedstale-cifar")
    h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    if h < 1 or w < 1:
        raise ConfigError(
            f"model.name = 'cnn-fedstale-cifar' needs images of at least 16x16, got {height}x{width}"
        )
    return LayeredModel(
        [
            nn.Sequential(nn.Conv2d(channels, 32, 5), nn.ReLU(), MaxPool2x2()),
            nn.Sequential(nn.Conv2d(32, 64, 5), nn.ReLU(), MaxPool2x2()),
            nn.Sequential(nn.Flatten(), nn.Linear(64 * h * w, 2048), nn.ReLU()),
            nn.Sequential(nn.Linear(2048, num_classes)),
        ]
    )


def simple_cnn(input_shape: Sequence[int], num_classes: int) -> LayeredModel:
    """pfl-research's CIFAR-10 benchmark CNN ("simple_cnn"): conv(->32, 3x3)-ReLU-conv(32->64,
    3x3)-ReLU-pool-fc(->128)-ReLU-fc(->classes), no padding; without its two dropout layers
    (fedhet's clients draw no dropout masks)."""
    channels, height, width = _image_shape(input_shape, "simple-cnn")
    h, w = (height - 4) // 2, (width - 4) // 2
    if h < 1 or w < 1:
        raise ConfigError(f"model.name = 'simple-cnn' needs images of at least 6x6, got {height}x{width}")
    return LayeredModel(
        [
            nn.Sequential(nn.Conv2d(channels, 32, 3), nn.ReLU()),
            nn.Sequential(nn.Conv2d(32, 64, 3), nn.ReLU(), MaxPool2x2()),
            nn.Sequential(nn.Flatten(), nn.Linear(64 * h * w, 128), nn.ReLU()),
            nn.Sequential(nn.Linear(128, num_classes)),
        ]
    )


def vgg(
    input_shape: Sequence[int], num_classes: int, variant: str = "vgg11", classifier: str = "one"
) -> LayeredModel:
    """VGG in its CIFAR form: each 3x3 conv + BN + ReLU (+ the stage's max-pool) is a layer,
    then one Linear(512, classes) (``classifier = "one"``) or three fully-connected layers,
    512-512 with ReLU and 512-classes (``"paper"``, ADEL-FL Sec. 5), each its own layer."""
    channels, height, width = _image_shape(input_shape, variant)
    pad = 0
    if (height, width) == (28, 28):
        pad = 2
    elif (height, width) != (32, 32):
        raise ConfigError(f"model.name = {variant!r} needs 28x28 or 32x32 images, got {height}x{width}")
    stages = VGG_STAGES[variant]
    blocks: list[nn.Module] = []
    in_ch = channels
    for i, item in enumerate(stages):
        if item == "M":
            continue
        parts: list[nn.Module] = [nn.ZeroPad2d(pad)] if not blocks and pad else []
        parts += [nn.Conv2d(in_ch, int(item), 3, padding=1), nn.BatchNorm2d(int(item)), nn.ReLU()]
        if i + 1 < len(stages) and stages[i + 1] == "M":
            parts.append(MaxPool2x2())
        blocks.append(nn.Sequential(*parts))
        in_ch = int(item)
    if classifier == "paper":
        blocks.append(nn.Sequential(nn.Flatten(), nn.Linear(512, 512), nn.ReLU()))
        blocks.append(nn.Sequential(nn.Linear(512, 512), nn.ReLU()))
        blocks.append(nn.Sequential(nn.Linear(512, num_classes)))
    else:
        blocks.append(nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return LayeredModel(blocks)


@dataclass
class ModelContext:
    """What a model is built for: one example's shape and the number of classes; where the
    model pre-trains a base centrally (:meth:`ZooModel.pretraining_share`), that base."""

    input_shape: tuple[int, ...]
    num_classes: int
    pretrained: Any = None


@dataclass
class MLPOptions:
    """``hidden``: the hidden layers' sizes, input to output."""

    hidden: list = field(default_factory=lambda: [32, 16])

    def validate(self) -> None:
        if not all(
            isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= MAX_HIDDEN for h in self.hidden
        ):
            raise ConfigError(f"model.hidden = {self.hidden!r}: must be integers in 1..{MAX_HIDDEN}")


MAX_HIDDEN = 65_536


class ZooModel:
    """A built-in model: ``build(options, ctx)`` calls the zoo function ``make``."""

    name = "base"
    Options: type = NoOptions
    make: Callable[[Sequence[int], int], LayeredModel] | None = None  # (input shape, classes) -> model
    # only layers the grouped kernels batch on the CPU (fedhet.client.grouped: dense and
    # per-example ones), so that the batched pool pays there (run.pool = "auto" picks it)
    batches_on_cpu: bool = False

    @classmethod
    def pretraining_share(cls, options) -> float:
        """The share of the training examples set aside, before clients are formed, to
        pre-train a base centrally (:meth:`pretrain`); 0: none (the default)."""
        return 0.0

    @classmethod
    def pretrain(cls, options, ctx: ModelContext, x: torch.Tensor, y: torch.Tensor, task) -> Any:
        """The base pre-trained on the examples set aside (``ctx.pretrained`` for
        :meth:`build`)."""
        raise NotImplementedError(f"model {cls.name!r} pre-trains nothing")

    @classmethod
    def build(cls, options, ctx: ModelContext) -> LayeredModel:
        """The model for a run's input shape and number of classes (``ctx``)."""
        if cls.make is None:
            raise NotImplementedError(f"model {cls.name!r} defines neither make nor build")
        return cls.make(ctx.input_shape, ctx.num_classes)


@register("model")
class MLP(ZooModel):
    """Fully connected layers with ReLU (SALF Sec. IV-A)."""

    name = "mlp"
    Options = MLPOptions
    batches_on_cpu = True

    @classmethod
    def build(cls, options: MLPOptions, ctx: ModelContext) -> LayeredModel:
        return mlp(ctx.input_shape, ctx.num_classes, options.hidden)


@register("model")
class CNN2(ZooModel):
    """Two 5x5 convolutions, two dense layers (SALF Sec. IV-A)."""

    name = "cnn2"
    make = staticmethod(cnn2)


@register("model")
class MLPExits(ZooModel):
    """``mlp`` with a classifier after every hidden layer (DepthFL's local models)."""

    name = "mlp-exits"
    Options = MLPOptions

    @classmethod
    def build(cls, options: MLPOptions, ctx: ModelContext) -> LayeredModel:
        from fedhet.models.exits import with_exits

        return with_exits(
            mlp(ctx.input_shape, ctx.num_classes, options.hidden), ctx.input_shape, ctx.num_classes
        )


@register("model")
class CNN2Exits(ZooModel):
    """``cnn2`` with a classifier after every block but the last (DepthFL's local models)."""

    name = "cnn2-exits"

    @classmethod
    def build(cls, options, ctx: ModelContext) -> LayeredModel:
        from fedhet.models.exits import with_exits

        return with_exits(cnn2(ctx.input_shape, ctx.num_classes), ctx.input_shape, ctx.num_classes)


@register("model")
class CNNFedStale(ZooModel):
    """The FedStale authors' MNIST CNN."""

    name = "cnn-fedstale"
    make = staticmethod(cnn_fedstale)


@dataclass
class LinearOptions:
    """``bias``: whether the linear map has one (off: a quadratic's point w, exactly);
    ``init``: the starting weights as one flat list (outputs x features, row by row), e.g.
    FedStale Fig. 1's w^(1) = (-10, -10); empty: PyTorch's default random start."""

    bias: bool = False
    init: list = field(default_factory=list)

    def validate(self) -> None:
        if not isinstance(self.bias, bool):
            raise ConfigError(f"model.bias = {self.bias!r}: expected true or false")
        if not isinstance(self.init, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in self.init
        ):
            raise ConfigError(f"model.init = {self.init!r}: expected a list of finite numbers")


@register("model")
class Linear(ZooModel):
    """One linear map, input features to outputs (no bias by default): with
    ``data.dataset = "quadratic"`` its weights are the point w of the client objectives."""

    name = "linear"
    Options = LinearOptions
    batches_on_cpu = True

    @classmethod
    def build(cls, options: LinearOptions, ctx: ModelContext) -> LayeredModel:
        features = 1
        for size in ctx.input_shape:
            features *= int(size)
        flatten: list[nn.Module] = [nn.Flatten()] if len(ctx.input_shape) > 1 else []
        layer = nn.Linear(features, ctx.num_classes, bias=options.bias)
        if options.init:
            if len(options.init) != layer.weight.numel():
                raise ConfigError(
                    f"model.init: {len(options.init)} numbers given, the {ctx.num_classes} x {features} "
                    f"weights need {layer.weight.numel()}"
                )
            with torch.no_grad():
                layer.weight.copy_(torch.tensor(options.init, dtype=layer.weight.dtype).view_as(layer.weight))
        return LayeredModel([nn.Sequential(*flatten, layer)])


@register("model")
class CNNFedStaleCIFAR(ZooModel):
    """The FedStale authors' CIFAR-10 CNN."""

    name = "cnn-fedstale-cifar"
    make = staticmethod(cnn_fedstale_cifar)


@register("model")
class SimpleCNN(ZooModel):
    """pfl-research's benchmark CNN (without dropout)."""

    name = "simple-cnn"
    make = staticmethod(simple_cnn)


class CharEmbedding(nn.Module):
    """Character indices (a float tensor, as datasets hold features) -> learned vectors."""

    def __init__(self, vocabulary: int, dimension: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, dimension)

    def forward(self, x):
        return self.embedding(x.long().clamp_(0, self.embedding.num_embeddings - 1)).flatten(1)


def char_mlp(input_shape: Sequence[int], num_classes: int, vocabulary: int = 80, dimension: int = 8,
             hidden: int = 256) -> LayeredModel:  # fmt: skip
    """Sequences of character indices (LEAF's Shakespeare): layer 1 embeds each character
    (``vocabulary`` x ``dimension``), layer 2 a ReLU Linear over the whole sequence, layer 3
    the classifier (the next character)."""
    if len(input_shape) != 1:
        raise ConfigError(
            f"model.name = 'char-mlp' needs sequences of character indices, got {tuple(input_shape)}"
        )
    length = int(input_shape[0])
    return LayeredModel(
        [
            nn.Sequential(CharEmbedding(vocabulary, dimension)),
            nn.Sequential(nn.Linear(length * dimension, hidden), nn.ReLU()),
            nn.Sequential(nn.Linear(hidden, num_classes)),
        ]
    )


@dataclass
class CharMLPOptions:
    """``vocabulary``: characters (LEAF's 80); ``dimension``: the embedding's; ``hidden``:
    the dense layer's width."""

    vocabulary: int = 80
    dimension: int = 8
    hidden: int = 256

    def validate(self) -> None:
        for key in ("vocabulary", "dimension", "hidden"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HIDDEN:
                raise ConfigError(f"model.{key} = {value!r}: must be an integer in 1..{MAX_HIDDEN}")


@register("model")
class CharMLP(ZooModel):
    """Embedded characters, a dense layer, a classifier (LEAF's Shakespeare)."""

    name = "char-mlp"
    Options = CharMLPOptions

    @classmethod
    def build(cls, options: CharMLPOptions, ctx: ModelContext) -> LayeredModel:
        return char_mlp(
            ctx.input_shape, ctx.num_classes, options.vocabulary, options.dimension, options.hidden
        )


@dataclass
class VGGOptions:
    """``classifier``: ``"one"`` Linear(512, classes) (the CIFAR form, the default) or
    ``"paper"``: three fully-connected layers (ADEL-FL Sec. 5)."""

    classifier: str = "one"

    def validate(self) -> None:
        if self.classifier not in VGG_CLASSIFIERS:
            raise ConfigError(
                f"model.classifier = {self.classifier!r}: unknown (known: {', '.join(VGG_CLASSIFIERS)})"
            )


VGG_CLASSIFIERS = ("one", "paper")


def _vgg_plugin(variant: str) -> type:
    @register("model", variant)
    class VGG(ZooModel):
        __doc__ = f"{variant.upper()} with BatchNorm, CIFAR form (one Linear classifier or three)."
        name = variant
        Options = VGGOptions

        @classmethod
        def build(cls, options: VGGOptions, ctx: ModelContext) -> LayeredModel:
            return vgg(ctx.input_shape, ctx.num_classes, variant, options.classifier)

    VGG.__qualname__ = VGG.__name__ = variant.upper()
    return VGG


VGG11, VGG13, VGG16, VGG19 = (_vgg_plugin(v) for v in VGG_STAGES)


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (32, 16)
) -> LayeredModel:
    """Build model ``name`` (any registered model plug-in) for inputs of ``input_shape`` and
    ``num_classes`` classes; ``hidden`` is the mlp's."""
    from fedhet.registry import resolve

    entry = resolve("model", name, "model.name")
    options = MLPOptions(list(hidden)) if entry.cls is MLP else entry.cls.Options()
    return entry.cls.build(options, ModelContext(tuple(input_shape), num_classes))
