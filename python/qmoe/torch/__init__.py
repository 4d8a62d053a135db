"""qmoe for PyTorch: the torch.ops.qmoe operators, the QMoE module and transformers MoE blocks.

Importing this package registers torch.ops.qmoe.moe_forward and moe_forward_out."""

from ._ops import get_layer, moe_forward, moe_forward_out, register_layer, unregister_layer  # noqa
from .modules import (ADAPTERS, REFUSED, QMoE, QMoEBlock, quantize_moe_block,  # noqa
                      replace_moe_blocks)
