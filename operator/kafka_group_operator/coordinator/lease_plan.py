"""Which partition Leases one replica should take and give up: a fair share, without an allocator.

Pure: given what this replica sees (each partition's Lease holder and when, by this replica's
own clock, that Lease expires; the replicas known to be alive), ``plan`` says which free or
expired Leases to take and which held ones to give up. Every replica runs it on its own view;
the Leases' optimistic concurrency settles races, so the plan only has to make the replicas
converge when their views agree:

- The live replicas are those named by the membership signal, every holder of an unexpired
  Lease, and this replica.
- With P partitions and N live replicas, ``P mod N`` replicas may hold ``ceil(P/N)`` and the
  others ``floor(P/N)``: which ones is decided by rank in name order, the same on every
  replica, so the targets add up to exactly P and shares differ by at most one. (Capping
  everyone at ``ceil(P/N)`` alone could leave a replica with nothing: 4 partitions on 3
  replicas split 2, 2, 0.)
- A replica takes a Lease only when it is free, expired, or already its own (a restarted
  replica with the same name); never one that another live holder still holds.
- A replica over its target gives up first the Leases it holds but does not serve (left from
  before a restart), then its highest partitions.
- Free and expired Leases are dealt out, the same way on every replica so that replicas
  short of their target at the same moment (after a handover, say) do not race for the same
  ones: each goes back to its last holder when that one is alive and short, the rest in
  partition order to the replicas short of their target, in name order, each getting what
  it lacks. A replica takes what is dealt to it.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LeaseView:
    """One partition's Lease as this replica sees it.

    ``holder`` is None when the Lease is free (released, or not created yet); ``expires_at``
    is on this replica's clock (when it saw the record change, plus the Lease's duration).
    """

    partition: int
    holder: str | None
    expires_at: float


@dataclass(frozen=True, slots=True)
class Plan:
    """What one replica should do now: Leases to take and Leases to give up, by partition."""

    take: tuple[int, ...]
    give_up: tuple[int, ...]
    target: int


def live_holder(view: LeaseView, now: float) -> str | None:
    """Who holds the Lease at ``now``: its holder unless it is free or expired."""
    if view.holder is None or view.expires_at <= now:
        return None
    return view.holder


def targets(partitions: int, replicas: Collection[str]) -> dict[str, int]:
    """How many partitions each replica should hold: floor or ceil of P/N, summing to P."""
    ranked = sorted(set(replicas))
    if not ranked:
        return {}
    base, extra = divmod(partitions, len(ranked))
    return {name: base + (1 if rank < extra else 0) for rank, name in enumerate(ranked)}


def plan(
    me: str,
    leases: Sequence[LeaseView],
    alive: Collection[str],
    now: float,
    held: Collection[int] = (),
) -> Plan:
    """What ``me`` should take and give up, given ``leases`` (partition p's at index p).

    ``held`` are the partitions ``me`` serves now. A Lease that names ``me`` but is not among
    them (this replica restarted under the same name) is taken back, as its own, before any
    other; it is given up instead when it is over the target.
    """
    live = [live_holder(view, now) for view in leases]
    replicas = sorted({*alive, *(h for h in live if h is not None), me})
    shares = targets(len(leases), replicas)
    target = shares[me]
    served = set(held)
    mine = sorted(
        (view.partition for view in leases if live_holder(view, now) == me),
        key=lambda p: (p not in served, p),
    )
    keep, give_up = mine[:target], tuple(sorted(mine[target:]))
    reclaim = [p for p in keep if p not in served]
    dealt = deal(leases, live, replicas, shares)
    take = tuple(reclaim + dealt.get(me, [])[: target - len(keep)])
    return Plan(take=take, give_up=give_up, target=target)


def deal(
    leases: Sequence[LeaseView],
    live: Sequence[str | None],
    replicas: Sequence[str],
    shares: dict[str, int],
) -> dict[str, list[int]]:
    """The free or expired Leases (``live[p]`` is None), dealt to the replicas short of their
    share (see the module docstring): replica -> partitions."""
    holding = collections.Counter(holder for holder in live if holder is not None)
    lacking = {name: max(shares[name] - holding[name], 0) for name in replicas}
    dealt: dict[str, list[int]] = collections.defaultdict(list)
    rest = []
    for view in leases:
        if live[view.partition] is not None:
            continue
        last = view.holder
        if last is not None and len(dealt[last]) < lacking.get(last, 0):
            dealt[last].append(view.partition)
        else:
            rest.append(view.partition)
    for name in replicas:
        wanted = lacking[name] - len(dealt[name])
        if wanted > 0:
            dealt[name].extend(rest[:wanted])
            rest = rest[wanted:]
    return dict(dealt)
