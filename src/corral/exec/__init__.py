"""`corral exec`: one command in a sandbox, composed with the broker and journal (like `run/`)."""
