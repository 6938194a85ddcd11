"""/api/v1/users/usage: each user's fair-share usage, what their jobs hold and wait for,
and their quotas."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service import store
from service.api.deps import EngineDep, SettingsDep, pooled
from service.api.responses import GUARDED
from service.db import read_session
from service.models import utcnow

router = APIRouter(prefix="/users", tags=["users"], responses=GUARDED)


class UserUsageRead(BaseModel):
    """One user's standing in fair share: the queue serves the least usage first."""

    name: str = Field(examples=["alice"])
    usage_device_s: float = Field(
        description="Device-seconds used, decayed: what was used one half-life "
        "(TRAINYARD_FAIR_SHARE_HALF_LIFE_S) ago counts half.",
        examples=[86400.0],
    )
    running_devices: int = Field(description="Devices their jobs hold now.", examples=[2])
    queued_jobs: int = Field(description="Jobs they have queued.", examples=[5])
    max_running_devices: int | None = Field(
        description="Devices their jobs may hold at once (their own quota, else the "
        "default); null: no limit.",
        examples=[4],
    )
    max_queued_jobs: int | None = Field(
        description="Jobs they may have queued; null: no limit.", examples=[100]
    )


@router.get("/usage", summary="Each user's fair-share usage and quotas")
@pooled
def get_usage(engine: EngineDep, settings: SettingsDep) -> list[UserUsageRead]:
    """Every user, least recent usage first: the order the queue serves them in."""
    with read_session(engine) as session:
        rows = store.usage_by_user(
            session,
            utcnow(),
            settings.fair_share_half_life_s,
            default_max_running=settings.max_running_devices_per_user,
            default_max_queued=settings.max_queued_jobs_per_user,
        )
    return [UserUsageRead(**row._asdict()) for row in rows]
