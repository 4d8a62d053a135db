"""qmoe: quantized Mixture-of-Experts layers from Python.

    import qmoe
    layer = qmoe.Layer.from_float(fc1, fc2, top_k=2, format="int4", backend="cpu")
    y = layer.run(x, router_logits)

The torch operator and nn.Module live in qmoe.torch (imported on demand, torch is optional).
docs/python.md describes the API."""

from ._qmoe import Error, backend_available, built_with_cuda, quantization_error_budget  # noqa
from ._qmoe import default_fc_format, layer_file_metadata  # noqa: F401
from .layer import Layer, dequantize_fc, quantize_fc, save_layer_file  # noqa: F401
from .spec import (Activation, Backend, CombineMode, DType, FcFormat, Fp4Layout,  # noqa: F401
                   GluLayout, LayerSpec, OrtSemantics, RoutingMethod, SharedWeight, TieBreak,
                   WeightFormat, as_enum, fc_format, make_spec)
from ._qmoe import ActivationSpec, RoutingSpec  # noqa: F401

__version__ = "0.1.0"
