"""Domain errors, raised below the API and mapped to HTTP in one handler (service/api/errors.py)."""

from __future__ import annotations

from typing import Any


class TrainyardError(Exception):
    """Base of every error a user can cause."""


class JobNotFound(TrainyardError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class SweepNotFound(TrainyardError):
    def __init__(self, sweep_id: int) -> None:
        super().__init__(f"sweep {sweep_id} not found")
        self.sweep_id = sweep_id


class WebhookNotFound(TrainyardError):
    """No webhook has this id, or none of the asker's (ids are not told apart)."""

    def __init__(self, webhook_id: int) -> None:
        super().__init__(f"webhook {webhook_id} not found")
        self.webhook_id = webhook_id


class InvalidTransition(TrainyardError):
    """A status change the state machine does not allow (e.g. cancel of a finished job)."""


class IdempotencyConflict(TrainyardError):
    """An Idempotency-Key reused with a different job spec."""


class SpecInvalid(TrainyardError):
    """A job spec that passed type checks but not the catalog (recipe, params, devices)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors

    @classmethod
    def at(cls, loc: tuple[str | int, ...], msg: str, type_: str = "value_error") -> SpecInvalid:
        """One error at a field path, in FastAPI's validation-error shape."""
        return cls([{"loc": ["body", *loc], "msg": msg, "type": type_}])


class WebhookAddressRefused(SpecInvalid):
    """A webhook's URL whose host is (or resolves to) an address the server may not send
    to: loopback, private, link-local ... (``service.webhooks.address``)."""

    def __init__(self, message: str) -> None:
        super().__init__([{"loc": ["body", "url"], "msg": message, "type": "address_refused"}])
        self.message = message


class BlobNotFound(TrainyardError):
    """No stored blob has this digest."""

    def __init__(self, digest: str) -> None:
        super().__init__(f"blob {digest} not found: upload it with PUT /api/v1/blobs/{digest}")
        self.digest = digest


class BlobDigestMismatch(TrainyardError):
    """The bytes received hash to another digest than the one they were sent under."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"the body's digest is {got}, not {expected}: nothing was stored")


class BlobTooLarge(TrainyardError):
    """A blob past its size limit (checked on Content-Length and on the bytes counted)."""

    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(f"blob larger than {limit} bytes (the limit set by {setting})")
        self.limit = limit
        self.setting = setting


class BlobStorageFull(TrainyardError):
    """The disk (or quota) that holds the blobs is full; nothing was kept."""


class BlobInUse(TrainyardError):
    """A blob that an unfinished job uses cannot be deleted."""

    def __init__(self, digest: str, job_ids: list[int]) -> None:
        jobs = ", ".join(map(str, job_ids))
        super().__init__(f"blob {digest} is used by unfinished jobs: {jobs}")
        self.job_ids = job_ids


class PackageInvalid(TrainyardError):
    """A code package (zip) that is refused, naming the entry at fault when there is one."""

    def __init__(self, why: str, entry: str | None = None) -> None:
        where = f"code package entry {entry!r}" if entry else "code package"
        super().__init__(f"{where}: {why}")
        self.entry = entry


class NotAllowed(TrainyardError):
    """An action on someone else's job (or an admin's action) by a user who may not."""


class UserNotFound(TrainyardError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no user {name!r}: an admin adds one with `trainyard users add`")


class UserExists(TrainyardError):
    def __init__(self, name: str) -> None:
        super().__init__(f"user {name!r} already exists")


class TokenNotFound(TrainyardError):
    def __init__(self, token_id: int) -> None:
        super().__init__(f"no token {token_id}")


class QueueQuotaReached(TrainyardError):
    """A submit past the user's limit on queued jobs."""

    def __init__(self, user: str, queued: int, limit: int, setting: str) -> None:
        super().__init__(
            f"{user} has {queued} jobs queued, the most allowed ({limit}, {setting}): "
            "submit again once some have started, or ask an admin to raise the limit"
        )
