"""Going on after ranks are lost: ``shrink_group`` (the survivors name the lost ranks, as
``torch.distributed.shrink_group`` on nccl) and ``shrink_to_survivors`` (the ranks that still
reach each other agree on who goes on — after a partition only a strict majority — through
``pcclCommShrinkSurvivors``). Both make a new group over a new communicator, register it with
torch as ``shrink_group`` does (the default group's replacement becomes the default; its other
groups are destroyed, since their ranks are renumbered) and destroy the old group.

Re-exported by :mod:`pccl.torch`."""

from __future__ import annotations

import ctypes

import torch.distributed as dist

from . import _lib


def _target(group):
    c10d = dist.distributed_c10d
    pg = group if group is not None else c10d._get_default_group()
    from .torch import _pccl_backend_of  # noqa: PLC0415 (torch.py imports this module)
    be = _pccl_backend_of(pg)
    if be is None:
        raise TypeError("pccl: shrink_group / shrink_to_survivors need a pccl process group")
    return pg, be


def _old_ranks(comm, old_rank: int) -> list[int]:
    """Every member's rank in the old group, in the new communicator's order (one host
    all-gather over the new communicator)."""
    n = comm.size
    mine = ctypes.c_int64(old_rank)
    out = (ctypes.c_int64 * n)()
    code = _lib.lib().pcclAllGather(ctypes.byref(mine), out, 1, _lib.pcclInt64, comm.handle,
                                    None)
    _lib.check("pcclAllGather", code, comm.handle)
    return list(out)


def _replace(pg, be, comm, keep):
    """Registers a group over ``comm`` (the old group's ranks ``keep``, ascending) in place of
    ``pg``, as torch's shrink_group does, and returns it."""
    c10d = dist.distributed_c10d
    excluded = [r for r in range(be.size()) if r not in keep]
    if not excluded:  # nobody is missing: the group stays as it is
        comm.destroy()
        return pg
    if be is not pg:
        # torch >= 2.12 keeps pccl behind a c10d ProcessGroup: torch's own shrink_group
        # makes the new group, and PcclBackend.shrink hands it this communicator.
        be._shrunk_ready = (tuple(excluded), comm)
        try:
            return c10d.shrink_group(excluded, group=pg)
        finally:
            ready, be._shrunk_ready = getattr(be, "_shrunk_ready", None), None
            if ready is not None:  # torch refused before asking the backend
                ready[1].destroy()
    needed = ("_update_process_group_global_state", "_cleanup_process_group_global_state",
              "_destroy_all_other_groups", "_update_default_pg", "_process_group_name")
    if not all(hasattr(c10d, n) for n in needed):
        comm.destroy()
        raise RuntimeError("pccl: this torch has no shrink_group internals to register a "
                           "shrunk group with")
    backend_name, store = c10d._world.pg_map[pg]
    config = c10d._world.pg_backend_config.get(pg, "")
    ranks = c10d.get_process_group_ranks(pg)
    remaining = [ranks[r] for r in keep]
    name = c10d._process_group_name(remaining, use_hashed_name=True)
    child = be._child(comm, store, keep, be._options._timeout, name)
    child.setGroupDesc(("default" if pg == c10d._get_default_group() else
                        be.getGroupDesc()) + ":shrunk")
    is_default = pg == c10d._get_default_group()
    if is_default:
        c10d._destroy_all_other_groups(exclude_group=pg)
    try:
        dist.destroy_process_group(pg)
    except Exception:  # noqa: BLE001 (its peers are gone: best effort)
        be.abort()
    c10d._cleanup_process_group_global_state(pg)
    if is_default:
        c10d._update_default_pg(child)
    c10d._update_process_group_global_state(
        pg=child, backend_name=backend_name, store=store, group_name=name,
        backend_config=config,
        rank_mapping={g: i for i, g in enumerate(remaining)})
    return child


def shrink_group(ranks_to_exclude, group=None):
    """A new group of the ranks of ``group`` (default: the default group) not in
    ``ranks_to_exclude`` (ranks of ``group``; dead ranks, which take no part), made by the
    ranks that stay, which pass the same list (checked). ``pcclCommShrink`` underneath; the
    old group is destroyed. On torch >= 2.12 this is ``torch.distributed.shrink_group``,
    which pccl supports (its new group serves the device the old one was bound to, else the
    CPU); on torch 2.11 pccl registers the new group itself."""
    pg, be = _target(group)
    excluded = sorted({int(r) for r in ranks_to_exclude})
    if not excluded:
        raise ValueError("pccl: shrink_group needs at least one rank to exclude")
    if be is not pg:  # torch >= 2.12: torch's own, through PcclBackend.shrink
        return dist.distributed_c10d.shrink_group(excluded, group=pg)
    comm = be._live().shrink(excluded)
    keep = [r for r in range(be.size()) if r not in excluded]
    return _replace(pg, be, comm, keep)


def shrink_to_survivors(group=None):
    """After a failure (a dead rank, a timeout, a partition), every rank still running calls
    this: the ranks that still reach each other agree on who goes on and get a new group of
    them (the old group is destroyed). On the minority side of a partition, or counted out by
    the others, it raises :class:`pccl.PcclError` instead — only a strict majority of the
    ranks not proven dead goes on. Each round in which a rank does not answer costs up to the
    group's timeout. With nobody missing, ``group`` is returned as it is."""
    pg, be = _target(group)
    comm = be._live().shrink_to_survivors()
    try:
        keep = _old_ranks(comm, be.rank())
    except Exception:
        comm.destroy()
        raise
    return _replace(pg, be, comm, keep)
