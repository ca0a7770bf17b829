"""SaslHandshake and SaslAuthenticate: SASL/PLAIN, username = group id, password = token.

The tokens are the member API's (``access.tokens``): a connection authenticated as group A
is refused (``GROUP_AUTHORIZATION_FAILED``) on every request about group B. As in Kafka, a
failed authentication is answered and then the connection is closed, and nothing but
ApiVersions and these two APIs is served before authentication when tokens are required.

While the operator is still reading the groups' tokens (after a start, ``access.tokens``), a
group without a token yet cannot be told apart from one that has none. Refusing it would be
fatal to the client, so SaslAuthenticate is held until the tokens are loaded, for at most
``Services.loading_hold_s``; still loading then, it is answered
``COORDINATOR_LOAD_IN_PROGRESS`` (retriable, as Kafka answers while it loads its state) and
the connection closed: the client connects and authenticates again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import errors
from kafka_group_operator.protocol import dispatch

MECHANISMS = ("PLAIN",)


async def sasl_handshake(ctx: dispatch.RequestContext, request: Any) -> Any:
    if request.mechanism not in MECHANISMS:
        return ctx.response(error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=MECHANISMS)
    ctx.session.mechanism = request.mechanism
    return ctx.response(error_code=ErrorCode.none, mechanisms=MECHANISMS)


def parse_plain(auth_bytes: bytes) -> tuple[str, str]:
    """(username, password) of a SASL/PLAIN message (RFC 4616: authzid NUL authcid NUL
    passwd); ``ValueError`` when malformed or when the authzid names someone else."""
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3:
        raise ValueError("a PLAIN message is authzid NUL username NUL password")
    authzid, username, password = (part.decode("utf-8") for part in parts)
    if not username or not password:
        raise ValueError("empty username or password")
    if authzid and authzid != username:
        raise ValueError("authorization id differs from the username")
    return username, password


async def sasl_authenticate(ctx: dispatch.RequestContext, request: Any) -> Any:
    session = ctx.session
    try:
        if session.mechanism is None:
            raise ValueError("SaslHandshake must come first")
        if session.principal is not None:
            raise ValueError("already authenticated")
        username, password = parse_plain(bytes(request.auth_bytes))
        store = ctx.services.token_store
        if store is not None:
            await _authorize_once_loaded(store, username, password, ctx.services.loading_hold_s)
    except errors.CoordinatorLoadInProgress as error:
        session.close_after_response = True
        return ctx.response(
            error_code=ErrorCode.coordinator_load_in_progress,
            error_message=error.message,
            auth_bytes=b"",
        )
    except (ValueError, UnicodeError, errors.CoordinatorError) as error:
        session.close_after_response = True
        message = error.message if isinstance(error, errors.CoordinatorError) else str(error)
        return ctx.response(
            error_code=ErrorCode.sasl_authentication_failed,
            error_message=f"Authentication failed: {message}",
            auth_bytes=b"",
        )
    session.principal, session.password = username, password
    return ctx.response(error_code=ErrorCode.none, error_message=None, auth_bytes=b"")


# How often a held SaslAuthenticate looks again whether the tokens are loaded.
_LOADING_POLL_S = 0.05


async def _authorize_once_loaded(
    store: tokens.TokenStore, username: str, password: str, hold_s: float
) -> None:
    """``tokens.authenticate`` (which fetches a token this replica was not given), retried
    while the store is still loading, for ``hold_s``."""
    deadline = time.monotonic() + hold_s
    while True:
        try:
            await tokens.authenticate(store, username, password)
            return
        except errors.CoordinatorLoadInProgress:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(_LOADING_POLL_S)
