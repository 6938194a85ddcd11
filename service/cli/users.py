"""A team's box from the command line: ``trainyard users`` (add, ls, set, usage),
``trainyard tokens`` (create, ls, revoke) and ``trainyard audit``. Each is an API call
with your token (``--token`` or ``TRAINYARD_API_TOKEN``); adding users, changing quotas
and reading the audit trail need an admin's."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.printable import printable
from service.cli.show import moment

users_app = typer.Typer(help="The box's users, their quotas and usage.", no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens: yours, or anyone's as an admin.", no_args_is_help=True)
app.add_typer(users_app, name="users")
app.add_typer(tokens_app, name="tokens")

DEFAULT = "default"  # a quota given as this goes back to the server's default


@users_app.command("add")
def add_user(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="May act on every job.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Add a user (admins); then give them a token with `trainyard tokens create NAME`."""
    with connect(url, token) as client:
        user = client.add_user(name, admin=admin)
    typer.echo(f"added {user.name}{' (admin)' if user.admin else ''}")


@users_app.command("ls")
def list_users(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The users, with their own quotas (- : the server's default)."""
    with connect(url, token) as client:
        users = client.users()
    typer.echo(f"{'NAME':<20} {'ADMIN':<6} {'MAX DEVICES':>11} {'MAX QUEUED':>10}")
    for user in users:
        typer.echo(
            printable(
                f"{user.name:<20} {'yes' if user.admin else '':<6} "
                f"{_limit(user.max_running_devices):>11} {_limit(user.max_queued_jobs):>10}"
            )
        )


@users_app.command("set")
def set_quotas(
    name: str,
    max_running_devices: Annotated[
        str | None, typer.Option(help=f"Devices their jobs may hold at once, or {DEFAULT}.")
    ] = None,
    max_queued_jobs: Annotated[
        str | None, typer.Option(help=f"Jobs they may have queued, or {DEFAULT}.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Give a user quotas of their own (admins)."""
    change = {
        field: _quota(value, option)
        for field, value, option in (
            ("max_running_devices", max_running_devices, "--max-running-devices"),
            ("max_queued_jobs", max_queued_jobs, "--max-queued-jobs"),
        )
        if value is not None
    }
    if not change:
        raise typer.BadParameter("give --max-running-devices or --max-queued-jobs")
    with connect(url, token) as client:
        user = client.set_quotas(name, **change)
    typer.echo(
        f"{user.name}: max running devices {_limit(user.max_running_devices)}, "
        f"max queued jobs {_limit(user.max_queued_jobs)}"
    )


@users_app.command("usage")
def usage(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Fair share: each user's decayed usage, least first (the order the queue serves)."""
    with connect(url, token) as client:
        rows = client.usage()
    typer.echo(f"{'USER':<20} {'DEVICE-HOURS':>12} {'RUNNING':>11} {'QUEUED':>11}")
    for row in rows:
        running = f"{row.running_devices}/{_limit(row.max_running_devices)}"
        queued = f"{row.queued_jobs}/{_limit(row.max_queued_jobs)}"
        hours = row.usage_device_s / 3600
        typer.echo(printable(f"{row.name:<20} {hours:>12.2f} {running:>11} {queued:>11}"))


@tokens_app.command("create")
def create_token(
    name: str,
    expires: Annotated[
        str | None, typer.Option(help="Refused after this long: 90d, 12w or 1y; default never.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """A new token for NAME (yourself, or anyone as an admin): printed this once."""
    days = _days(expires) if expires is not None else None
    with connect(url, token) as client:
        made = client.create_token(name, expires_in_days=days)
    until = f", expires {moment(made.expires_at, 10)}" if made.expires_at else ""
    typer.echo(f"token {made.id} for {made.user}{until} (shown once; keep it secret):")
    typer.echo(made.token)


@tokens_app.command("ls")
def list_tokens(
    name: Annotated[str | None, typer.Argument(help="Whose; default yours.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """A user's tokens by id and prefix (never the tokens themselves)."""
    with connect(url, token) as client:
        name = name or client.me().name
        tokens = client.tokens(name)
    typer.echo(f"{'ID':>5}  {'PREFIX':<10} {'CREATED':<10} {'EXPIRES':<10} STATE")
    for t in tokens:
        state = "revoked" if t.revoked_at else "active"
        expires = moment(t.expires_at, 10) or "never"
        created = moment(t.created_at, 10)
        typer.echo(f"{t.id:>5}  {t.prefix:<10} {created:<10} {expires:<10} {state}")


@tokens_app.command("revoke")
def revoke_token(token_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Revoke a token (yours, or anyone's as an admin): refused from now on."""
    with connect(url, token) as client:
        revoked = client.revoke_token(token_id)
    typer.echo(f"revoked token {revoked.id} ({revoked.prefix}...) of {revoked.user}")


@app.command()
def audit(
    actor: Annotated[str | None, typer.Option(help="Only this user's acts.")] = None,
    limit: int = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Who did what, newest first (admins)."""
    with connect(url, token) as client:
        page = client.audit(actor=actor, limit=limit)
    typer.echo(f"{'AT':<19}  {'ACTOR':<12} {'ACTION':<14} TARGET  DETAIL")
    for event in page.items:
        detail = " ".join(f"{k}={v}" for k, v in (event.detail or {}).items())
        line = f"{moment(event.at)}  {event.actor:<12} {event.action:<14} {event.target}"
        typer.echo(printable(f"{line}  {detail}".rstrip()))


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _quota(value: str, option: str) -> int | None:
    if value == DEFAULT:
        return None
    if not value.isdigit() or int(value) < 1:
        raise typer.BadParameter(f"{option}: a whole number of at least 1, or {DEFAULT}")
    return int(value)


_SPANS = {"d": 1, "w": 7, "y": 365}


def _days(text: str) -> int:
    """'90d', '12w', '1y' -> days."""
    match = re.fullmatch(r"(\d+)([dwy])", text.strip())
    if match is None:
        raise typer.BadParameter(f"--expires {text!r}: give a number and d, w or y (90d, 12w, 1y)")
    return int(match.group(1)) * _SPANS[match.group(2)]
