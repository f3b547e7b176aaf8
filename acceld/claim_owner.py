"""Whose a Placement consumer is: the rule a standalone claim (API 2.8) keeps, in the API
before it takes a ``consumer_uuid`` and in the conductor before each write of a claim's
allocation (acceld.conductor.placement.claim_allocations).

acceld writes a consumer only if Placement has no such consumer (no allocation), or holds
it as a standalone claim's (consumer type ``ACCELD_CLAIM``) of the claim's project with
allocations on acceld's providers alone. Anything else is another's: a Nova instance's or
migration's (its allocations, its unshelve, its resize), or another project's claim.
"""

from __future__ import annotations

from acceld.clients import placement as pl

CONSUMER_TYPE = "ACCELD_CLAIM"


def refusal(consumer_uuid: str, held: pl.Consumer, foreign: list[str],
            project_id: str | None) -> str | None:
    """Why acceld may not write this consumer for ``project_id`` (None: it may). ``held``:
    Placement's answer for it; ``foreign``: the providers it holds that are not acceld's.
    ``project_id`` None: any project's claim consumer is acceld's (a consumer whose row is
    gone, whose allocation acceld removes)."""
    if foreign:
        return (f"Placement consumer {consumer_uuid} holds allocations on providers acceld "
                f"does not manage ({', '.join(foreign)}): acceld writes only consumers of "
                "its own")
    if held.generation is None:  # Placement has no such consumer
        return None
    if held.consumer_type != CONSUMER_TYPE:
        return (f"Placement consumer {consumer_uuid} is of type {held.consumer_type}, not a "
                "standalone claim's: acceld writes only consumers of its own")
    if project_id is not None and held.project_id != project_id:
        return (f"Placement consumer {consumer_uuid} belongs to another project: acceld "
                "writes only consumers of its own")
    return None
