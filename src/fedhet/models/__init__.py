"""Models that declare their layers, input to output (DESIGN idea 4)."""

from fedhet.models.layers import FlatModel, LayeredModel
from fedhet.models.zoo import MODELS, build_model

__all__ = ["MODELS", "FlatModel", "LayeredModel", "build_model"]
