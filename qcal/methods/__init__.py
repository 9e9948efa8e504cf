"""Quantization methods: runners that apply the pure algorithms of `qcal.quant` to a model
layer by layer, and their registry. Registration happens here, explicitly: a method is
known to qcal when this file names it.
"""

from qcal.methods import awq_runner, gptq_runner, rtn
from qcal.methods.registry import (
    QuantMethod,
    RunOptions,
    apply_result,
    iter_layer_linears,
    new_method_registry,
)

METHODS = new_method_registry()
for _method in (rtn.METHOD, gptq_runner.METHOD, awq_runner.METHOD):
    METHODS.register(_method.name, _method)


def method_for_config(config: object) -> QuantMethod:
    """The method whose config type `config` is (configs dispatch by type, not by name)."""
    for name in METHODS.names():
        method = METHODS.get(name)
        if isinstance(config, method.config_cls):
            return method
    raise TypeError(f"{type(config).__name__} is not the config of a registered method")


__all__ = ["METHODS", "QuantMethod", "RunOptions", "apply_result", "iter_layer_linears",
           "method_for_config"]
