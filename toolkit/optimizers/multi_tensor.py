"""The SGD family's update of every variable at once, on PyTorch.

Keras's PyTorch backend runs an optimizer eagerly, so a per-variable ``update_step`` costs a
few small kernels per variable, and Python's dispatch of each: on ResNet-50's 161 variables the
toolkit's LARS took 30x Keras's SGD on an H100. Keras's own SGD updates every variable with one
multi-tensor call per operation (``torch._foreach_*``), but only for its exact class. Here are
the toolkit's steps over lists of PyTorch tensors, in as few passes over memory as PyTorch's
kernels allow:

* :func:`buffered_momentum` is PyTorch's own SGD rule, so it is PyTorch's fused kernel
  (``torch._fused_sgd_``: one pass reads ``w``, ``g`` and the buffer and writes ``w`` and the
  buffer);
* :func:`heavy_ball` (MXNet's rule, the rate inside the velocity) is the same kernel given
  ``-rate * d`` as its gradient and ``-1`` as its rate, the velocity stored negated:
  ``v = m * v - rate * d; w -= -1 * v`` (on a CPU, with a rate per variable, the rate goes in
  as the kernel's dampening instead, so ``-rate * d`` is not written out: :func:`_heavy_ball_each`);
* :func:`trust_ratios` gives every variable's ratio as one vector, from two multi-tensor norms.

The kernels add and multiply in another order than :mod:`toolkit.optimizers.kernels`' steps
(``torch._foreach_norm`` sums in its own order too), so the two paths agree to float32's
rounding, not bit for bit. Hyperparameters are Python numbers, as the kernels take them (a
rate may also be a 0-d tensor): on a GPU, reading a scheduled value or the trust ratios is one
wait for the device per update, as Keras's own SGD waits for its rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.optimizers.trust_ratio import RatioRule


def like(value, weight: torch.Tensor) -> torch.Tensor:
    """``value`` (a gradient: a tensor, or an array from a notebook) as a tensor of
    ``weight``'s dtype on its device (itself when it is one already)."""
    if (
        isinstance(value, torch.Tensor)
        and value.dtype == weight.dtype
        and value.device == weight.device
    ):
        return value
    return torch.as_tensor(value, dtype=weight.dtype, device=weight.device)


@dataclass
class Update:
    """The variables one update moves, as PyTorch tensors, with what the optimizer knows them
    by: ``indices`` (each one's :meth:`_get_variable_index`), ``variables`` (Keras's), their
    tensors ``weights`` and their ``gradients`` (in their dtype and on their device)."""

    indices: list[int]
    variables: list
    weights: list
    gradients: list

    @classmethod
    def of(cls, optimizer, gradients, variables) -> Update:
        weights = [v.value for v in variables]
        return cls(
            [optimizer._get_variable_index(v) for v in variables],
            list(variables),
            weights,
            [like(g, w) for g, w in zip(gradients, weights, strict=True)],
        )

    def part(self, chosen: list[bool]) -> Update:
        """The variables where ``chosen`` (one flag per variable) holds."""
        return Update(
            *(
                [item for item, keep in zip(every, chosen, strict=True) if keep]
                for every in (self.indices, self.variables, self.weights, self.gradients)
            )
        )

    def __len__(self) -> int:
        return len(self.indices)


def coupled(gradients: list, weights: list, weight_decay: float) -> list:
    """``g + wd * w`` for each pair, in one pass; ``gradients`` themselves when ``wd`` is 0."""
    if weight_decay == 0:
        return gradients
    return torch._foreach_add(gradients, weights, alpha=weight_decay)


def buffered_momentum(
    weights,
    buffers,
    learning_rate,
    gradients,
    *,
    momentum: float,
    nesterov: bool,
    weight_decay: float = 0.0,
    dampening: float = 0.0,
    first_step: bool = False,
) -> None:
    """PyTorch's SGD on every variable: ``d = g + wd * w``; ``buf = d`` on the first step, else
    ``buf = momentum * buf + (1 - dampening) * d``; ``w -= lr * buf`` (Nesterov: ``w -= lr *
    (d + momentum * buf)``). ``buffers=None``: no momentum, ``w -= lr * d``."""
    torch._fused_sgd_(
        weights,
        gradients,
        buffers if momentum else [],
        weight_decay=weight_decay,
        momentum=momentum,
        lr=learning_rate,
        dampening=dampening,
        nesterov=nesterov,
        maximize=False,
        is_first_step=first_step,
    )


def heavy_ball(
    weights, velocities, rates, gradients, *, momentum: float, nesterov: bool, weight_decay: float
) -> None:
    """:func:`toolkit.optimizers.kernels.heavy_ball` on every variable: ``d = g + wd * w; v =
    momentum * v - rate * d; w += v`` (Nesterov: ``w += momentum * v - rate * d``), velocities
    stored negated; ``velocities=None``: no momentum, ``w -= rate * d``. ``rates``: one rate
    for every variable, or a list of numbers, one per variable."""
    if isinstance(rates, list):
        if weights[0].device.type == "cpu":  # see _heavy_ball_each
            _heavy_ball_each(
                weights, velocities, rates, gradients, momentum, nesterov, weight_decay
            )
            return
        negated = [-r for r in rates]
        if weight_decay == 0:
            steps = torch._foreach_mul(gradients, negated)
        else:  # -rate * (g + wd * w), scaled where it was made, not copied again
            steps = coupled(gradients, weights, weight_decay)
            torch._foreach_mul_(steps, negated)
        weight_decay = 0.0
    else:  # -rate * g here, and -rate * wd * w inside the kernel
        rate = float(rates)
        steps, weight_decay = torch._foreach_mul(gradients, -rate), -rate * weight_decay
    buffered_momentum(
        weights,
        velocities,
        -1.0,
        steps,
        momentum=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
    )


def _heavy_ball_each(weights, velocities, rates, gradients, momentum, nesterov, decay):
    """:func:`heavy_ball` with one rate a variable, variable by variable, each rate given to
    PyTorch's fused kernel where it takes one, so ``-rate * d`` is never written out: with
    momentum, as its dampening ``1 + rate``, whose ``(1 - dampening) * d`` is ``-rate * d``
    (``v = m * v - rate * d``, then ``w += v`` at rate -1; the kernel forms ``1 - dampening``
    in double, so a rate as small as 1e-9 keeps float32's rounding); without, as its rate
    (``w -= rate * d``). Nesterov, which adds ``d`` itself to the step, takes ``-rate * g`` in
    one pass and ``-rate * wd`` as the weight decay. LARS's update of a 2.4M-parameter MLP on
    one CPU core: 1.10-1.11x Keras's SGD, from 1.61-1.64x with ``-rate * g`` written out (3
    runs each). A kernel call a variable costs little on a CPU; on a GPU, where launches cost
    and memory passes are quick (and where the kernel's dampening arithmetic is not checked),
    the multi-tensor form stays."""
    buffers = [None] * len(weights) if velocities is None else velocities
    each = zip(weights, buffers, gradients, rates, strict=True)
    for weight, buffer, gradient, rate in each:
        step, kernel_rate, dampening, kernel_decay = gradient, rate, 0.0, decay  # no momentum
        if nesterov:
            step, kernel_rate, kernel_decay = torch.mul(gradient, -rate), -1.0, -rate * decay
        elif momentum:
            kernel_rate, dampening = -1.0, 1.0 + rate
        buffered_momentum(
            [weight],
            None if buffer is None else [buffer],
            kernel_rate,
            [step],
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=kernel_decay,
            dampening=dampening,
        )


@torch.no_grad()
def trust_ratios(weights, gradients, weight_decay, rule: RatioRule, gradient_norms=None):
    """Every variable's :func:`~toolkit.optimizers.trust_ratio.layer_trust_ratio` by ``rule``
    as one vector, in order: two multi-tensor norms, then a few vector operations.
    ``gradient_norms``, if given, are taken as the ``||g||`` (``gradients`` are then not
    read)."""
    weight_norms = torch.stack(torch._foreach_norm(weights))
    if gradient_norms is None:
        gradient_norms = torch._foreach_norm(gradients)
    gradient_norms = torch.stack([torch.as_tensor(n) for n in gradient_norms]).to(weight_norms)
    return rule.of_norms(weight_norms, gradient_norms, weight_decay)
