"""One gradient step of an optimizer on a loss: the step every PER algorithm written here repeats."""

from __future__ import annotations

import torch as th


def descend(optimizer: th.optim.Optimizer, loss: th.Tensor) -> None:
    """Clear ``optimizer``'s gradients, back-propagate ``loss`` and take one step."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
