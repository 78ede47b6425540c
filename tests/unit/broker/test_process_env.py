"""The pure parts of the launcher contract: proxy variables and the broker argv."""

from __future__ import annotations

from pathlib import Path

from corral.broker.process import broker_argv, proxy_env


def test_proxy_env() -> None:
    env = proxy_env(3128)
    url = "http://127.0.0.1:3128"
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "npm_config_proxy",
        "npm_config_https_proxy",
    ):
        assert env[name] == url
    # Only the sandbox's own loopback bypasses the broker; never a real host.
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert env["NODE_USE_ENV_PROXY"] == "1"
    assert proxy_env(1, "::1")["HTTP_PROXY"] == "http://[::1]:1"


def test_broker_argv() -> None:
    argv = broker_argv(
        "/r/journal.sqlite",
        run="r1",
        session="s1",
        env="agent",
        listen_fds=[5, 6],
        listen=["127.0.0.1:0"],
        listen_unix=["/r/b.sock"],
        ready_fd=7,
        parent_pid=99,
        python="/usr/bin/python3",
        source="/opt/corral/src",
    )
    assert argv[:3] == ["/usr/bin/python3", "-I", "-c"]
    assert argv[4:] == [
        "/opt/corral/src", "serve", "--config", "-",
        "--journal", "/r/journal.sqlite", "--env", "agent", "--run", "r1", "--session", "s1",
        "--listen-fd", "5", "--listen-fd", "6", "--listen", "127.0.0.1:0",
        "--listen-unix", "/r/b.sock", "--ready-fd", "7", "--parent-pid", "99",
    ]  # fmt: skip
    assert broker_argv("j") == broker_argv("j")
    # The broker runs the launcher's own corral, whatever the site-packages say.
    import corral

    assert broker_argv("j")[4] == str(Path(corral.__file__).resolve().parents[1])
