"""Fields pulled out of an invoice with regexes and typed gens: every value has the shape
its consumer expects (a date parses, an amount is a float), whatever the model writes.

    python examples/regex_fields.py
"""

from __future__ import annotations

import datetime

from braid import assistant, gen, program, select, user

INVOICE = """\
ACME Hardware Supply -- INVOICE
Inv. no: INV-2024-0193        issued 14 March 2024, pay within 30 days
Bill to: Northwind Traders, 12 Harbour Rd, Leith
  3 x cordless drill @ 89.90
  1 x safety goggles (pack of 10) @ 24.50
Total due EUR 294.20 -- thank you for your business!
"""

# (question, how its answer is constrained)
FIELDS = {
    "invoice_id": (
        "What is the invoice number?",
        gen("invoice_id", regex=r"INV-[0-9]{4}-[0-9]{4}"),
    ),
    "issued": (
        "When was it issued? Answer as YYYY-MM-DD.",
        gen("issued", regex=r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    ),
    "customer": (
        "Who is the invoice billed to?",
        gen("customer", regex=r"[A-Z][a-z]+( [A-Z][a-z]+){0,3}"),
    ),
    "total": ("What is the total due, as a number?", gen("total", dtype=float, max_tokens=8)),
    "currency": ("Which currency is it in?", select("currency", ["EUR", "USD", "GBP"])),
}


@program
def invoice_fields(s, invoice: str):
    s += user(f"Here is an invoice:\n{invoice}")
    s += assistant("I have read the invoice.")
    for question, answer in FIELDS.values():
        s += user(question)
        s += assistant(answer)


def main() -> dict:
    state = invoice_fields.run(invoice=INVOICE, sampling={"temperature": 0})
    values = {name: state[name] for name in FIELDS}
    values["issued"] = datetime.date.fromisoformat(values["issued"])
    for name, value in values.items():
        print(f"{name:>10}: {value!r}")
    return values


if __name__ == "__main__":
    main()
