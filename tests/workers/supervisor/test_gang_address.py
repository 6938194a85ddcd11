"""A worker whose ADVERTISE_ADDRESS is public takes no job across boxes: torch's
rendezvous runs what anyone who reaches it sends, unless a setting says the network is
private."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from service.settings import Settings
from workers.supervisor.gangs import Gangs, ipaddress_is_public


def test_which_addresses_are_public() -> None:
    assert ipaddress_is_public("8.8.8.8") and ipaddress_is_public("2001:4860:4860::8888")
    for private in ("10.0.0.5", "192.168.1.2", "172.16.0.1", "127.0.0.1", "100.64.0.1", "fd00::1"):
        assert not ipaddress_is_public(private), private


def test_a_worker_on_a_public_address_stays_out_of_gangs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected
    public = Settings(shared_dir=tmp_path, advertise_address="8.8.8.8")
    gangs = Gangs(engine, public, "w")
    assert gangs.enabled
    with caplog.at_level(logging.WARNING):
        gangs.check_address()
    assert not gangs.enabled and "public address" in caplog.text
    declared = Gangs(engine, public.model_copy(update={"private_network": True}), "w")
    with pytest.raises(SystemExit, match="not an address of this box"):
        declared.check_address()  # it takes part, so the address must be this box's
    engine.dispose()
