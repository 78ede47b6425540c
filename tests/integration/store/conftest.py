"""A real PostgreSQL for the store tests: initdb + postgres on a unix socket in a temp dir.

postgres refuses to run as root, so as root the server runs as `nobody`
(runuser); the socket directory is the only way in (listen_addresses='').
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_BIN = "/usr/lib/postgresql/15/bin"


@dataclass(frozen=True)
class PgServer:
    socket_dir: Path

    def url(self, db: str, user: str = "corral") -> str:
        return f"postgresql:///{db}?host={self.socket_dir}&user={user}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres", "pgadmin"), autocommit=True) as c:
            c.execute(sql.encode())


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    root = Path(tempfile.mkdtemp(prefix="corral-pg-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "nobody")
        root.chmod(0o700)
        data = root / "data"
        subprocess.run(
            _as_server_user(
                [f"{PG_BIN}/initdb", "-D", str(data), "-U", "pgadmin", "--auth=trust", "-E", "UTF8"]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        log = (root / "server.log").open("wb")
        proc = subprocess.Popen(
            _as_server_user(
                [
                    f"{PG_BIN}/postgres",
                    "-D",
                    str(data),
                    "-k",
                    str(root),
                    "-c",
                    "listen_addresses=",
                    "-c",
                    "max_connections=100",
                    "-c",
                    "fsync=on",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        try:
            sock = root / ".s.PGSQL.5432"
            deadline = time.monotonic() + 60
            while not sock.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((root / "server.log").read_text(errors="replace")[-2000:])
                time.sleep(0.05)
            srv = PgServer(root)
            for _ in range(200):
                try:
                    srv.admin("CREATE ROLE corral LOGIN NOSUPERUSER")
                    break
                except Exception:  # the server is still starting
                    time.sleep(0.05)
            yield srv
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh database owned by the non-superuser role `corral`."""
    db = f"t_{secrets.token_hex(4)}"
    pg_server.admin(f"CREATE DATABASE {db} OWNER corral")
    return pg_server.url(db)


def fresh_owned_db(pg_server: PgServer) -> str:
    """A fresh database owned by `corral_owner` (the schema owner; `corral_worker` exists)."""
    for role in ("corral_owner", "corral_worker"):
        pg_server.admin(
            f"DO $$BEGIN CREATE ROLE {role} LOGIN NOSUPERUSER; EXCEPTION WHEN duplicate_object"
            " THEN NULL; END$$"
        )
    db = f"g_{secrets.token_hex(4)}"
    pg_server.admin(f"CREATE DATABASE {db} OWNER corral_owner")
    return db


@pytest.fixture
def pg_worker(pg_server: PgServer) -> tuple[str, str]:
    """(owner URL, worker URL) of a fresh database migrated by its owner, worker granted."""
    db = fresh_owned_db(pg_server)
    owner = pg_server.url(db, "corral_owner")
    from corral.store.postgres import PgFleet, grant_worker

    with PgFleet(owner) as f:
        grant_worker(f._conn, "corral_worker")
    return owner, pg_server.url(db, "corral_worker")
