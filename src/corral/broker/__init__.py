"""The broker: the sandbox's only door to the network, and the journal.

Modules (pure ones marked *):
    actions*  typed actions and observations      policy*   decide(action, ctx, policy)
    config*   BrokerConfig (JSON for the process) hosts*    host/address canonical forms
    wire*     request targets, headers, SNI       journal   append-only SQLite journal
    resolver  the broker's own DNS                proxy     HTTP/CONNECT/routes server
    server    the broker process                  process   start_broker(), proxy_env()

Nothing is imported here, so `python -m corral.broker` and
`corral.broker.process` load only what they use.
"""

__all__: list[str] = []
