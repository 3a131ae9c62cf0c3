"""Networks of Part II by their paper names, built for a data set."""

from __future__ import annotations

from typing import Callable

import numpy as np

from lowrank.core.datasets import Dataset
from . import conv, mlp, vit

__all__ = ["for_data"]

IMAGE_NAMES = ("ResNet-18", "VGG-16", "ViT")


def for_data(model: str, data: Dataset, *, cnn_width: float = 1.0, vit_dim: int = 512,
             vit_depth: int = 6) -> tuple[Callable, Dataset]:
    """`(make, data)`: a constructor of `model` ("MLP-BN-10-100", "RES-4-64", "ResNet-18", "VGG-16",
    "ViT") sized for `data`, and the data in the shape the model takes (digits become 1x8x8 images
    for the image networks)."""
    if model in IMAGE_NAMES:
        if data.x_train.ndim == 2:
            side = int(round(data.x_train.shape[1] ** 0.5))
            if side * side != data.x_train.shape[1]:
                raise ValueError(f"{model} needs images; {data.name} inputs of length {data.x_train.shape[1]} are not square")
            data = data._replace(x_train=data.x_train.reshape(-1, 1, side, side),
                                 x_test=data.x_test.reshape(-1, 1, side, side))
        c_in, side = data.x_train.shape[1], data.x_train.shape[-1]
        if model == "ResNet-18":
            return (lambda: conv.resnet18(c_in, data.num_classes, width=cnn_width)), data
        if model == "ViT":
            return (lambda: vit.vit(side, c_in, data.num_classes, dim=vit_dim, mlp_dim=vit_dim, depth=vit_depth)), data
        return (lambda: conv.vgg16(c_in, data.num_classes, width=cnn_width, image_size=side)), data
    in_features = int(np.prod(data.x_train.shape[1:]))
    return (lambda: mlp.from_name(model, in_features, data.num_classes)), data
