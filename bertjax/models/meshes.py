"""Where model code finds the device mesh: the one the arrays are laid out on, never a
module field.

Inside a jitted function an array's abstract value carries the mesh JAX took from the
arguments' shardings (the trainer's sharded arrays, or ShapeDtypeStructs with a sharding when
compiling ahead of time; jit's in_shardings alone do not set it). The trainer sets no ambient
mesh (`jax.set_mesh`): under one, Flax's DenseGeneral constrains its kernels at their flat
initial shape, which fails. An ambient mesh, where a caller sets one, still comes first.
"""

from __future__ import annotations

import flax.linen as nn
import jax


def mesh_of(x) -> jax.sharding.AbstractMesh:
    """The mesh `x` is laid out on: the ambient one if any, else its own (empty when none)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = getattr(jax.typeof(x).sharding, "mesh", mesh)
    return mesh


def constrain(x, logical_axes: tuple):
    """`x` laid out as the logical axis rules (`nn.logical_axis_rules`, which the trainer
    traces its steps in) map `logical_axes`, on the mesh it is on; a no-op without one."""
    mesh = mesh_of(x)
    return nn.with_logical_constraint(x, logical_axes, mesh=None if mesh.empty else mesh)
