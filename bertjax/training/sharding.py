"""The device mesh, logical-axis rules, and shardings for state and batches.

This is the only file that builds meshes. The mesh has axes ('data', 'fsdp', 'tensor');
parameters carry logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`) that the rules
in the config map onto mesh axes, and batches are sharded along their first axis by the rule
for `batch`. Everything is checked up front so a mesh that does not fit the devices or a
dimension that does not divide its mesh axis is one clear error, not an XLA traceback.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

Rules = Sequence[tuple[str, Any]]


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """The mesh shape with its one -1 filled in from the device count, checked to fit."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh.shape {shape}: expected {len(MESH_AXES)} sizes for axes "
                         f"{MESH_AXES}")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh.shape {shape}: sizes must be positive, with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"mesh.shape {shape}: the fixed axes ({known} devices) do not "
                             f"divide the {num_devices} available devices")
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(f"mesh.shape {shape} needs {math.prod(shape)} devices, but there "
                         f"are {num_devices}; use -1 on one axis to fill from the device count")
    return shape


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    devices = list(devices) if devices is not None else jax.devices()
    resolved = resolve_mesh_shape(shape, len(devices))
    return jax.make_mesh(resolved, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def check_rules(rules: Rules) -> tuple[tuple[str, Any], ...]:
    """Rules as a tuple of (logical name, mesh axis | tuple of mesh axes | None)."""
    checked = []
    for rule in rules:
        if len(rule) != 2:
            raise ValueError(f"mesh.rules entry {rule!r}: expected (logical_axis, mesh_axes)")
        logical, axes = rule
        named = (axes,) if isinstance(axes, str) else tuple(axes or ())
        unknown = [a for a in named if a not in MESH_AXES]
        if unknown:
            raise ValueError(f"mesh.rules entry {rule!r}: unknown mesh axis {unknown[0]!r}; "
                             f"expected one of {MESH_AXES}")
        checked.append((logical, axes if isinstance(axes, str) or axes is None else tuple(axes)))
    return tuple(checked)


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


def param_shardings(abstract_boxed: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings for a tree of logically annotated (nn.Partitioned) abstract arrays.

    Raises a ValueError naming the parameter, dimension and mesh axis when a dimension is
    not divisible by the size of the mesh axes it is mapped to.
    """
    rules = check_rules(rules)
    logical_specs = nn.get_partition_spec(abstract_boxed)
    values = nn.unbox(abstract_boxed)

    def to_sharding(path, spec, value):
        mesh_spec = nn.logical_to_mesh_axes(spec, rules) if spec else PartitionSpec()
        for dim, (size, axes) in enumerate(zip(value.shape, mesh_spec)):
            if size % _axis_size(mesh, axes):
                name = jax.tree_util.keystr(path, simple=True, separator="/")
                raise ValueError(
                    f"parameter {name} {tuple(value.shape)}: dimension {dim} "
                    f"(logical axis {spec[dim]!r}, size {size}) is not divisible by mesh axis "
                    f"{axes!r} of size {_axis_size(mesh, axes)}; change mesh.shape or "
                    f"mesh.rules, or the model size")
        return NamedSharding(mesh, mesh_spec)

    return jax.tree_util.tree_map_with_path(
        to_sharding, logical_specs, values,
        is_leaf=lambda x: isinstance(x, PartitionSpec))


def optimizer_shardings(tx: optax.GradientTransformation, abstract_opt_state: Any,
                        params_shardings: Any, mesh: Mesh) -> Any:
    """Optimizer state sharded like the parameters it mirrors; counters replicated."""
    return optax.tree_map_params(
        tx, lambda _, sharding: sharding, abstract_opt_state, params_shardings,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_axes(rules: Rules):
    """The mesh axes the batch dimension is split over (the rule for logical 'batch')."""
    for logical, axes in check_rules(rules):
        if logical == "batch":
            return axes
    return None


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
    """Sharding of a [B, ...] batch array: rows split over the 'batch' rule's mesh axes."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(rules)))


def check_batch_size(global_batch_size: int, mesh: Mesh, rules: Rules,
                     grad_accum_steps: int = 1, process_count: int | None = None) -> None:
    """The global batch must split evenly into micro-batches, devices and hosts (this run's
    processes, or `process_count`)."""
    shards = _axis_size(mesh, batch_axes(rules))
    per_step = shards * grad_accum_steps
    if global_batch_size % per_step:
        raise ValueError(
            f"train.global_batch_size {global_batch_size} is not divisible by "
            f"grad_accum_steps ({grad_accum_steps}) x batch shards ({shards}, mesh axes "
            f"{batch_axes(rules)!r})")
    processes = jax.process_count() if process_count is None else process_count
    if global_batch_size % processes:
        raise ValueError(f"train.global_batch_size {global_batch_size} is not divisible by "
                         f"the {processes} processes")


def local_batch_size(global_batch_size: int) -> int:
    """Rows of the global batch that this process loads."""
    return global_batch_size // jax.process_count()


def local_rows(global_rows: np.ndarray) -> np.ndarray:
    """This process's contiguous share of rows that every process holds."""
    share = len(global_rows) // jax.process_count()
    return global_rows[jax.process_index() * share:(jax.process_index() + 1) * share]


def make_global_batch(local_batch: dict[str, np.ndarray], sharding: NamedSharding,
                      global_batch_size: int) -> dict[str, jax.Array]:
    """Global arrays from this process's rows; no host ever holds the whole batch."""
    def to_global(name, x):
        x = np.asarray(x)
        expected = local_batch_size(global_batch_size)
        if x.shape[0] != expected:
            raise ValueError(f"input feature {name!r} has {x.shape[0]} rows on process "
                             f"{jax.process_index()}, expected {expected} "
                             f"(global_batch_size / process_count)")
        return jax.make_array_from_process_local_data(
            sharding, x, (global_batch_size,) + x.shape[1:])
    return {name: to_global(name, x) for name, x in local_batch.items()}
