"""The one private-directory helper behind the control and resident-broker sockets."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from corral.broker.privdir import make_private_dirs, peer_uid, short_path
from corral.errors import BrokerError


def test_creates_missing_dirs_0700(tmp_path: Path) -> None:
    target = tmp_path / f"corral-{os.getuid()}" / "broker"
    make_private_dirs(target)
    for d in (target, target.parent):
        assert d.stat().st_mode & 0o777 == 0o700


def test_refuses_a_shared_per_user_base(tmp_path: Path) -> None:
    # Someone made the per-user base in a shared /tmp before us, open to all:
    # they could swap the directory below it.
    base = tmp_path / f"corral-{os.getuid()}"
    base.mkdir()
    base.chmod(0o777)
    with pytest.raises(BrokerError, match="mode 0700"):
        make_private_dirs(base / "broker")


def test_refuses_a_symlink_in_place_of_the_dir(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "sock").symlink_to(elsewhere)
    with pytest.raises(BrokerError):
        make_private_dirs(tmp_path / "sock")


def test_peer_uid_is_our_own_on_a_socketpair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert peer_uid(a) == os.getuid()


def test_short_path_binds_and_connects_below_sun_path_limit(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    make_private_dirs(deep)
    path = deep / "x.sock"
    assert len(os.fsencode(path)) > 108
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with server, client:
        with short_path(path) as where:
            server.bind(where)
        server.listen(1)
        assert path.exists()
        with short_path(path) as where:
            client.connect(where)
