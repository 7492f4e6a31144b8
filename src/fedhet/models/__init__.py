"""Models that declare their layers, input to output; each zoo model registers itself as a
``model`` plug-in (:mod:`fedhet.registry`)."""

from fedhet.models.layers import FlatModel, LayeredModel
from fedhet.models.zoo import ModelContext, build_model

__all__ = ["FlatModel", "LayeredModel", "ModelContext", "build_model"]
