"""Dotted-path access to submodules ("model.layers.3.mlp.up_proj"): the one helper both the
checkpoint format and the model plumbing need, kept below both."""

from __future__ import annotations

from torch import nn


def get_module(root: nn.Module, path: str) -> nn.Module:
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module


def set_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = get_module(root, parent_path) if parent_path else root
    setattr(parent, leaf, new)
