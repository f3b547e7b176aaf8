"""`acceld simulate` sends a registered agent's heartbeat ahead of the first hellos still
waiting: real agents have a connection each, so a node's heartbeat never waits behind
other nodes' registrations. In a plain FIFO the heartbeats of the first nodes to register
waited behind thousands of registrations, past the down window, and were marked down."""

from __future__ import annotations

import asyncio

from acceld.cmd.simulator import Heartbeats, SimulatedAgent


def test_heartbeats_of_registered_agents_go_first() -> None:
    agents = [SimulatedAgent(i, f"sim-{i:05d}", []) for i in range(5)]
    loop = asyncio.new_event_loop()
    try:
        beats = Heartbeats(agents, ["http://127.0.0.1:1"], 10.0, 1, loop)
        beats._queues = [asyncio.PriorityQueue()]  # as _start makes them
        for agent in agents[:3]:  # three first hellos wait
            beats._due(agent.index)
        agents[4].registered = agents[3].registered = True
        beats._due(4)  # registered: their heartbeats are due now
        beats._due(3)
        queue = beats._queues[0]
        order = [queue.get_nowait()[2] for _ in range(queue.qsize())]
    finally:
        loop.close()
    assert order == [4, 3, 0, 1, 2]
