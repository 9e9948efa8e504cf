"""Quantization methods: runners that apply the pure algorithms of `qcal.quant` to a model
layer by layer, and their registry.

A method is one file: it defines `METHOD = QuantMethod(...)` (config type, runner, CLI
flags with their schema rules, checkpoint fields). Registration happens here, explicitly:
a method is known to qcal when its module is in `METHOD_MODULES`. The CLI, the option
schema, recipes and grids build their tables from the registry, so adding a method is
one new file plus its line below.
"""

from qcal.methods import (
    autoround,
    awq_runner,
    gptaq,
    gptq_runner,
    hqq,
    rtn,
    rtn_imatrix,
    rtn_mse,
)
from qcal.methods.registry import (
    MethodFlag,
    QuantMethod,
    RunOptions,
    apply_result,
    iter_layer_linears,
    new_method_registry,
)

# The order is the order of their flags in `qcal quantize --help`.
METHOD_MODULES = (rtn, gptq_runner, awq_runner, rtn_mse, rtn_imatrix, hqq, gptaq, autoround)

METHODS = new_method_registry()
for _module in METHOD_MODULES:
    METHODS.register(_module.METHOD.name, _module.METHOD)


def all_methods() -> tuple[QuantMethod, ...]:
    """The registered methods, in `METHOD_MODULES` order."""
    return tuple(module.METHOD for module in METHOD_MODULES)


def method_for_config(config: object) -> QuantMethod:
    """The method whose config type `config` is (configs dispatch by type, not by name;
    the exact type, as RTN-imatrix's config extends RTN-MSE's)."""
    for method in all_methods():
        if type(config) is method.config_cls:
            return method
    raise TypeError(f"{type(config).__name__} is not the config of a registered method")


def method_config_types() -> dict[str, type]:
    """Config class name -> class, for every method (how a saved recipe names its method)."""
    return {method.config_cls.__name__: method.config_cls for method in all_methods()}


__all__ = ["METHODS", "METHOD_MODULES", "MethodFlag", "QuantMethod", "RunOptions",
           "all_methods", "apply_result", "iter_layer_linears", "method_config_types",
           "method_for_config"]
