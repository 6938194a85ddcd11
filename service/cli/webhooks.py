"""``trainyard webhooks``: be told at a URL of yours when your jobs and sweeps end (add,
ls, show, ping, rm). Each delivery is signed with the webhook's secret, which `add`
prints once."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.printable import printable
from service.cli.show import moment

webhooks_app = typer.Typer(
    help="URLs told when your jobs and sweeps end (signed deliveries, retried).",
    no_args_is_help=True,
)
app.add_typer(webhooks_app, name="webhooks")


@webhooks_app.command("add")
def add_webhook(
    target: Annotated[str, typer.Argument(metavar="URL", help="Where each event is POSTed.")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            "-e",
            help="job.succeeded, job.failed, job.cancelled, job.requeued, sweep.finished, "
            "sweep.failed, sweep.cancelled; repeat it. Default: every end (not requeued).",
            show_default=False,
        ),
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(help="Sign with this secret (default: one made for you, printed once)."),
    ] = None,
    slack: Annotated[
        bool, typer.Option("--slack", help="Post a readable line to a Slack incoming webhook.")
    ] = False,
    all_users: Annotated[
        bool, typer.Option("--all-users", help="Every user's jobs and sweeps (admins).")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Add a webhook; prints its id and the signing secret (shown this once)."""
    with connect(url, token) as client:
        hook = client.add_webhook(
            target, events=event, secret=secret, format="slack" if slack else "json",
            all_users=all_users,
        )  # fmt: skip
    typer.echo(f"webhook {hook.id}: {', '.join(hook.events)}")
    if secret is None:
        typer.echo(f"secret: {hook.secret}  (shown this once: the receiver checks with it)")


@webhooks_app.command("ls")
def list_webhooks(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Your webhooks (an admin's: everyone's)."""
    with connect(url, token) as client:
        hooks = list(client.webhooks())
    typer.echo(f"{'ID':>5}  {'OWNER':<12} {'FORMAT':<6} {'EVENTS':<40} URL")
    for hook in hooks:
        events = ",".join(hook.events) + (" (all users)" if hook.all_users else "")
        typer.echo(
            printable(f"{hook.id:>5}  {hook.owner:<12} {hook.format:<6} {events:<40} {hook.url}")
        )


@webhooks_app.command("show")
def show_webhook(webhook_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A webhook and its last deliveries: state, attempts, the receiver's answer."""
    with connect(url, token) as client:
        hook = client.webhook(webhook_id)
    typer.echo(printable(f"webhook {hook.id} ({hook.owner}, {hook.format}): {hook.url}"))
    typer.echo(f"events: {', '.join(hook.events)}{' (all users)' if hook.all_users else ''}")
    if not hook.deliveries:
        typer.echo("no deliveries yet")
        return
    typer.echo(f"{'DELIVERY':>8}  {'EVENT':<16} {'SUBJECT':<12} {'STATE':<9} {'TRIES':>5}  LAST")
    for d in hook.deliveries:
        last = str(d.last_status_code or "") if d.state == "delivered" else d.last_error or ""
        when = moment(d.delivered_at or d.next_attempt_at)
        typer.echo(
            printable(
                f"{d.id:>8}  {d.event:<16} {d.subject:<12} {d.state:<9} {d.attempts:>5}  "
                f"{last} {when}".rstrip()
            )
        )


@webhooks_app.command("ping")
def ping_webhook(webhook_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Send a webhook.ping event now (see how it went with `show`)."""
    with connect(url, token) as client:
        delivery = client.ping_webhook(webhook_id)
    typer.echo(f"delivery {delivery.id}: {delivery.state}")


@webhooks_app.command("rm")
def remove_webhook(
    webhook_ids: Annotated[list[int], typer.Argument(metavar="ID...")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete webhooks (their pending deliveries are not sent)."""
    with connect(url, token) as client:
        for webhook_id in webhook_ids:
            client.delete_webhook(webhook_id)
            typer.echo(f"deleted webhook {webhook_id}")
