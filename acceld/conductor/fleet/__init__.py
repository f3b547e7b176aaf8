"""The fleet: conductors' membership and hash ring, agents' hellos and heartbeats, their
endpoints, hardware pulls and liveness."""
