"""Who owns a group id, and the group tokens an operator start must read before anything else.

A group id is owned by one ConsumerGroup resource (namespace, name, uid), recorded in the
coordinator's state topic when it claims the id, so it survives restarts. While nobody owns
an id, the oldest resource naming it is the one that may claim it. Another resource naming
the same ``groupId`` is a second claimant: it gets ``Ready=False, GroupIdConflict`` and
changes nothing (no token, no settings, no children, no offset reset, no snapshot), and its
deletion discards nothing. The owner's deletion releases the id; a waiting claimant then
takes it over on its next retry.

``load_tokens`` runs once per operator start: it reads the token Secret of every existing
ConsumerGroup (the owners' only) and then marks the token store loaded. Until then the
member API answers ``COORDINATOR_LOAD_IN_PROGRESS`` for groups it has no token for, so
members that heartbeat during an operator restart wait instead of failing.

``TokenLookup`` is the token store's source (``access.tokens``) afterwards: a group created
since, on a replica that neither reconciled nor coordinated it, has its token read on demand
the same way (the ConsumerGroups naming the id, their owner, its Secret). The list of
ConsumerGroups is shared by the lookups of one moment (read at most once per
``list_interval_s``), and Secrets are read a few at a time. A group id missing from a list
begun before the lookup is looked up again in the next list: the group may have been created
a moment ago, its pods already presenting its token, and a refusal is fatal to a member.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import messages
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import consumer_group
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors

GROUP_ID_CONFLICT = "GroupIdConflict"

logger = logging.getLogger(__name__)


class GroupOwners(Protocol):
    """Who owns a group id, as recorded by its coordinator: the control plane's port
    (``coordinator_port``) or, at start, the local runtime."""

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None: ...

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner: ...


class GroupIdConflict(spec_errors.SpecError):
    """Another ConsumerGroup owns the group id; retried, as its deletion frees the id."""

    reason = GROUP_ID_CONFLICT


def owner_of(meta: Mapping[str, Any]) -> messages.GroupOwner:
    return messages.GroupOwner(
        namespace=str(meta["namespace"]), name=str(meta["name"]), uid=str(meta.get("uid", ""))
    )


def group_id_of(body: Mapping[str, Any]) -> str:
    """The group id a ConsumerGroup names (spec.groupId, else ``<namespace>.<name>``)."""
    meta = body.get("metadata") or {}
    group_id = (body.get("spec") or {}).get("groupId")
    if isinstance(group_id, str) and group_id:
        return group_id
    return specs.default_group_id(meta["namespace"], meta["name"])


async def claim(
    owners: GroupOwners,
    kube: kube_client.KubeClient,
    group_id: str,
    meta: Mapping[str, Any],
    namespaces: tuple[str, ...],
) -> messages.GroupOwner:
    """Claim ``group_id`` for the resource with ``meta``; the owner after the claim.

    That is another resource when it owns the id, or when nobody owns it yet and another
    existing ConsumerGroup naming it is older (then nothing is recorded: the older one claims
    it on its own reconciliation). So the outcome does not depend on the order in which
    resources are reconciled, e.g. after an upgrade from a version without owners, where
    every resource claims at once. Raises ``KubeError`` and ``CoordinatorError``.
    """
    if await owners.group_owner(group_id) is None:
        elder = await _elder_claimant(kube, group_id, meta, namespaces)
        if elder is not None:
            return owner_of(elder)
    return await owners.claim_group(messages.ClaimGroupRequest(group_id, owner_of(meta)))


async def _elder_claimant(
    kube: kube_client.KubeClient,
    group_id: str,
    meta: Mapping[str, Any],
    namespaces: tuple[str, ...],
) -> Mapping[str, Any] | None:
    """The metadata of the oldest other live ConsumerGroup naming ``group_id``, if older."""

    def age(other: Mapping[str, Any]) -> tuple[str, str]:
        # RFC 3339 timestamps of one format order as text; the uid breaks ties.
        return (str(other.get("creationTimestamp") or ""), str(other.get("uid") or ""))

    elders = []
    for namespace in namespaces or (None,):
        for body in await kube.list(kube_client.CONSUMER_GROUPS, namespace):
            other = body.get("metadata") or {}
            if (
                group_id_of(body) == group_id
                and other.get("uid") != meta.get("uid")
                and not other.get("deletionTimestamp")
                and age(other) < age(meta)
            ):
                elders.append(other)
    return min(elders, key=age) if elders else None


async def owns(owners: GroupOwners, group_id: str, meta: Mapping[str, Any]) -> bool:
    """Whether the resource with ``meta`` owns ``group_id`` now; False too while the
    coordinator cannot tell (its partition is loading): callers act on a later attempt."""
    try:
        owner = await owners.group_owner(group_id)
    except coordinator_errors.CoordinatorError:
        return False
    return owner is not None and owner.uid == meta.get("uid")


async def other_owner(
    owners: GroupOwners, group_id: str, meta: Mapping[str, Any]
) -> messages.GroupOwner | None:
    """The other resource that owns ``group_id``, if one does (``None``: this one, or none
    yet, as for a resource created a moment ago)."""
    owner = await owners.group_owner(group_id)
    return owner if owner is not None and owner.uid != meta.get("uid") else None


def conflict_message(group_id: str, owner: messages.GroupOwner) -> str:
    return (
        f"group id {group_id!r} is owned by ConsumerGroup {owner.namespace}/{owner.name}; "
        "this resource changes nothing until that one is deleted"
    )


async def load_tokens(
    kube: kube_client.KubeClient,
    owners: GroupOwners,
    store: tokens.GroupTokens,
    namespaces: tuple[str, ...],
) -> int:
    """Read the token of every existing ConsumerGroup that owns its group id; then mark the
    store loaded. Returns how many tokens were read; raises ``KubeError`` to be retried.

    A group id without a recorded owner (a resource not reconciled yet) gets the token of
    its only claimant; with several claimants it waits for the reconciliation to decide.
    """
    bodies: list[Mapping[str, Any]] = []
    for namespace in namespaces or (None,):
        bodies.extend(await kube.list(kube_client.CONSUMER_GROUPS, namespace))
    claimants: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for body in bodies:
        claimants[group_id_of(body)].append(body)
    loaded = 0
    for group_id, claiming in claimants.items():
        try:
            owner = await owners.group_owner(group_id)
        except coordinator_errors.CoordinatorError:
            owner = None  # its partition is not serving: its members cannot run anyway
        chosen = _tokens_resource(claiming, owner)
        if chosen is None:
            continue
        try:
            token = await _read_token(kube, chosen)
        except kube_errors.Forbidden as error:
            # Not a reason to keep every other group waiting: this group's reconciliation
            # reports the missing right.
            logger.warning("cannot read the token of group %s: %s", group_id, error)
            continue
        if token:
            store.set(group_id, token)
            loaded += 1
    store.mark_loaded()
    return loaded


def _tokens_resource(
    claiming: list[Mapping[str, Any]], owner: messages.GroupOwner | None
) -> Mapping[str, Any] | None:
    """Of the ConsumerGroups naming a group id, the one whose token is the group's: the
    recorded owner, else the only claimant; None when that cannot be told (several
    claimants and no owner yet: the reconciliation decides)."""
    if owner is not None:
        return next(
            (b for b in claiming if (b.get("metadata") or {}).get("uid") == owner.uid), None
        )
    return claiming[0] if len(claiming) == 1 else None


async def _read_token(kube: kube_client.KubeClient, body: Mapping[str, Any]) -> str | None:
    meta = body["metadata"]
    secret = await kube.get_or_none(
        kube_client.SECRETS, meta["namespace"], consumer_group.token_secret_name(meta["name"])
    )
    return consumer_group.token_from_secret(secret) if secret is not None else None


class TokenLookup:
    """A group's token read from the Kubernetes API on demand (``access.tokens``' source).

    ``owners()`` answers who owns a group id when several resources name it: the control
    plane's port, which reaches the group's coordinator wherever it runs. A resource being
    deleted still counts (its pods may still run); an id nobody names has no token.
    Kubernetes errors become ``COORDINATOR_LOAD_IN_PROGRESS`` (retriable): the token may
    exist, this replica cannot tell now.
    """

    def __init__(
        self,
        kube: kube_client.KubeClient,
        owners: Callable[[], GroupOwners],
        namespaces: tuple[str, ...],
        list_interval_s: float = 1.0,
        concurrent_reads: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._owners = owners
        self._namespaces = namespaces
        self._list_interval_s = list_interval_s
        self._clock = clock
        self._reads = asyncio.Semaphore(concurrent_reads)
        self._listing: asyncio.Task[dict[str, list[Mapping[str, Any]]]] | None = None
        self._listed_at = -math.inf

    async def __call__(self, group_id: str) -> str | None:
        asked_at = self._clock()
        try:
            claiming = (await self._claimants()).get(group_id, [])
            if not claiming and self._listed_at < asked_at:
                # Only a list begun after the lookup tells that nobody names the id.
                claiming = (await self._claimants(begun_after=asked_at)).get(group_id, [])
            if not claiming:
                return None
            owner = None
            if len(claiming) > 1:
                owner = await self._owners().group_owner(group_id)
            chosen = _tokens_resource(claiming, owner)
            if chosen is None:
                return None
            async with self._reads:
                return await _read_token(self._kube, chosen)
        except kube_errors.Forbidden as error:
            logger.warning("cannot read the token of group %s: %s", group_id, error)
            return None
        except kube_errors.KubeError as error:
            raise coordinator_errors.CoordinatorLoadInProgress(
                f"cannot read the token of group {group_id!r} now: {error}"
            ) from error
        except coordinator_errors.CoordinatorError as error:
            if error.retriable:
                raise coordinator_errors.CoordinatorLoadInProgress(
                    f"the owner of group {group_id!r} is not known now: {error}"
                ) from error
            raise

    async def _claimants(
        self, begun_after: float = -math.inf
    ) -> dict[str, list[Mapping[str, Any]]]:
        """Group id -> the ConsumerGroups naming it, listed at most once per interval (the
        lookups of one moment share one list); from a list begun at ``begun_after`` or later,
        waited for when the interval does not allow one yet."""
        listing = self._listing
        if listing is not None and self._listed_at < begun_after:
            await asyncio.wait([listing])  # its outcome is its own waiters' to see
            delay = self._listed_at + self._list_interval_s - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            listing = self._listing  # another lookup may have begun the next one meanwhile
            if listing is not None and self._listed_at < begun_after:
                listing = None
        if listing is None or (
            listing.done() and self._clock() - self._listed_at >= self._list_interval_s
        ):
            self._listed_at = self._clock()
            listing = self._listing = asyncio.ensure_future(self._list())
        try:
            return await asyncio.shield(listing)
        except BaseException:
            if listing.done() and self._listing is listing:
                self._listing = None  # a failed list is not kept: the next lookup lists
            raise

    async def _list(self) -> dict[str, list[Mapping[str, Any]]]:
        claimants: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
        for namespace in self._namespaces or (None,):
            for body in await self._kube.list(kube_client.CONSUMER_GROUPS, namespace):
                with contextlib.suppress(KeyError, TypeError):
                    claimants[group_id_of(body)].append(body)
        return dict(claimants)


async def keep_loading_tokens(
    kube: kube_client.KubeClient,
    owners: GroupOwners,
    store: tokens.GroupTokens,
    namespaces: tuple[str, ...],
    logger: Any = logger,
) -> None:
    """``load_tokens`` until it succeeds (the API server may not answer yet)."""
    delay = 0.5
    while True:
        if kube.configured:
            try:
                count = await load_tokens(kube, owners, store, namespaces)
            except kube_errors.KubeError as error:
                logger.warning(
                    "cannot read the groups' tokens yet (retry in %.0fs): %s", delay, error
                )
            else:
                logger.info("read the tokens of %d groups", count)
                return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 30.0)
