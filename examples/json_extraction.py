"""Typed extraction from messy text: each note becomes a `Contact`, decoded and valid by
construction (the JSON schema is enforced token by token), all notes in one batch.

    python examples/json_extraction.py
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from braid import assistant, gen, program, system, user

# Bounds keep a small model from rambling inside a string until max_tokens.
Name = Annotated[str, msgspec.Meta(max_length=30)]


class Contact(msgspec.Struct):
    name: Name
    company: Name
    email: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9._-]{1,30}@[a-z0-9-]{1,20}\.[a-z]{2,6}$")]
    phone: Annotated[str, msgspec.Meta(pattern=r"^\+?[0-9 ()-]{7,20}$")] | None
    follow_up: bool


NOTES = [
    "met maria lopez (acme robotics) at the expo!! her mail: maria.lopez@acme.io, "
    "cell +34 612 345 678 -- wants a demo next week",
    "Call from J. Chen, Globex. jchen@globex.com. no phone given. not interested for now.",
    "fwd: intro to Sam Okafor <sam@okafor-labs.dev>, Okafor Labs, tel (555) 010-2299, "
    "pls follow up asap",
    "business card: PRIYA NAIR / Initech / priya.nair@initech.co / +91 98 7654 3210",
]


@program
def extract(s, note: str):
    s += system("You extract contact details from notes into JSON.")
    s += user(f"Note: {note}\nReturn the contact as JSON.")
    s += assistant(gen("contact", json_schema=Contact, max_tokens=128))


def main() -> list[Contact]:
    states = extract.run_batch(
        [{"note": n} for n in NOTES], sampling={"temperature": 0}, progress=True
    )
    contacts = []
    for note, state in zip(NOTES, states, strict=True):
        if state.error is not None:
            print(f"failed on {note[:40]!r}: {state.error}")
            continue
        contact = state["contact"]  # a Contact instance
        contacts.append(contact)
        print(msgspec.json.encode(contact).decode())
    return contacts


if __name__ == "__main__":
    main()
