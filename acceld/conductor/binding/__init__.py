"""Binding: bind jobs from claim to ``Bound`` and Nova's event (worker), the target checks
(target), the program and attach-handle steps a bind may need (programming, attach), outages
waited out (outages), wake-ups (wakes), and the attach-handle release queue (handle_release)
with the agents' attach-step client (attach_client)."""
