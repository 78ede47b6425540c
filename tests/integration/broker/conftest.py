"""Fixtures for the broker's integration tests: CA, servers, brokers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig

from .testlib import Handler, RecordingServer, RunningBroker, ThrowawayCA, launch, make_ca

ServerFactory = Callable[..., RecordingServer]
BrokerFactory = Callable[..., RunningBroker]


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def servers() -> Iterator[ServerFactory]:
    started: list[RecordingServer] = []

    def make(
        routes: dict[str, Handler] | None = None, tls: ThrowawayCA | None = None
    ) -> RecordingServer:
        server = RecordingServer(routes, tls.server_context() if tls is not None else None)
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[BrokerFactory]:
    started: list[RunningBroker] = []

    def make(
        config: BrokerConfig,
        environ: dict[str, str] | None = None,
        listen_fds: tuple[int, ...] = (),
        name: str = "journal.sqlite",
    ) -> RunningBroker:
        broker = launch(config, tmp_path / name, environ, listen_fds)
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.process.stop()
