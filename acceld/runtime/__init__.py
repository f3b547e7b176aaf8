"""What every long-running acceld process needs at run time, whichever service it is:
how it lives and stops (signals, SIGHUP's reload, the announce line: lifecycle) and its
internal keys (secrets). Below the services' entry points (acceld.services), which start
them, and below the agent, the conductor and the clients, which use them."""
