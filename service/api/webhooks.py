"""/api/v1/webhooks: be told when your jobs and sweeps end.

A webhook is a URL the server POSTs each event to, signed with its secret (see
``trainyard.signatures`` for how a receiver checks it); the deliveries are sent by the
server's dispatcher (``service.webhooks.dispatcher``), never in a request's path."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from service.api.deps import (
    EngineDep,
    IdentityDep,
    OwnerFilter,
    PageLimit,
    PageOffset,
    SettingsDep,
    owner_named,
    pooled,
)
from service.api.responses import GUARDED, JSON_BODY, SPEC_REFUSED, WRITE, Responses, error
from service.db import read_session
from service.models import MAX_INT32
from service.webhooks import store
from service.webhooks.models import (
    WEBHOOK_EXAMPLE,
    DeliveryRead,
    WebhookCreate,
    WebhookCreated,
    WebhookList,
    WebhookRead,
)

router = APIRouter(prefix="/webhooks", tags=["webhooks"], responses=GUARDED)

WebhookId = Annotated[int, Path(ge=1, le=MAX_INT32, description="The webhook's id.")]
WEBHOOK_NOT_FOUND: Responses = {404: error("No webhook of yours has this id")}
ADDRESS_REFUSED: Responses = {
    422: error(
        "The request is invalid: its fields, or a URL whose host is (or resolves to) a "
        "loopback, private, link-local or other non-public address"
    ),
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Add a webhook: the secret is shown once",
    responses=WRITE | JSON_BODY | SPEC_REFUSED | ADDRESS_REFUSED,
)
@pooled
def create_webhook(
    spec: Annotated[
        WebhookCreate,
        Body(openapi_examples={"ci": {"summary": "Job ends, JSON", "value": WEBHOOK_EXAMPLE}}),
    ],
    response: Response,
    engine: EngineDep,
    settings: SettingsDep,
    who: IdentityDep,
) -> WebhookCreated:
    """Your jobs' and sweeps' ends (the events you name) are POSTed to url, signed with
    the secret (yours, or one made for you: keep it, it is not shown again). all_users:
    every user's (admins only, else 403)."""
    created = store.create_webhook(engine, who, spec, settings)
    response.headers["Location"] = f"/api/v1/webhooks/{created.id}"
    return created


@router.get("", summary="List webhooks, newest first")
@pooled
def list_webhooks(
    engine: EngineDep,
    who: IdentityDep,
    owner: OwnerFilter = None,
    limit: PageLimit = 50,
    offset: PageOffset = 0,
) -> WebhookList:
    """Your own webhooks; an admin sees everyone's (owner: one user's). Without their
    secrets or deliveries (GET one for its deliveries)."""
    with read_session(engine) as session:
        return store.list_webhooks(
            session, who, owner=owner_named(who, owner), limit=limit, offset=offset
        )


@router.get(
    "/{webhook_id}", summary="A webhook with its last deliveries", responses=WEBHOOK_NOT_FOUND
)
@pooled
def get_webhook(webhook_id: WebhookId, engine: EngineDep, who: IdentityDep) -> WebhookRead:
    """The webhook (never its secret) and its last 20 deliveries, newest first: each
    event, its state, attempts, the receiver's last status code or error, and when."""
    with read_session(engine) as session:
        return store.get_webhook(session, who, webhook_id)


@router.delete(
    "/{webhook_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a webhook and its deliveries",
    responses=WRITE | WEBHOOK_NOT_FOUND,
)
@pooled
def delete_webhook(webhook_id: WebhookId, engine: EngineDep, who: IdentityDep) -> Response:
    """Your own webhook, or any as an admin. Nothing more is sent to it."""
    store.delete_webhook(engine, who, webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{webhook_id}/ping",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Send a webhook.ping delivery to a webhook",
    responses=WRITE | WEBHOOK_NOT_FOUND,
)
async def ping_webhook(
    webhook_id: WebhookId, request: Request, engine: EngineDep, who: IdentityDep
) -> DeliveryRead:
    """Enqueue a webhook.ping event, sent as any delivery is (signed, retried); GET the
    webhook to see how it went."""
    delivery = await run_in_threadpool(store.ping, engine, who, webhook_id)
    wakeup = request.app.state.webhooks_wakeup  # None where this process sends none
    if wakeup is not None:
        wakeup.set()
    return delivery
