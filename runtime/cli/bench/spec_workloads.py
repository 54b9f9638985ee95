"""`braid bench spec`'s prompts, data only: four extraction documents (each about 1,000 tokens of
the default tokenizer, filled in four ways: sixteen documents) with their schemas, four Python
files with four edits each, sixteen support tickets an agent resolves in five tool calls, and
sixteen open-ended prompts."""

from __future__ import annotations

# Who a document is about: each template below is filled with each of these, so that sixteen
# requests at once are sixteen different documents (no two share more than their opening).
PARTIES = [
    dict(company="Harbor Point Logistics GmbH", person="Ingrid Sørensen", city="Hamburg",
         street="Am Sandtorkai 41, 20457", ref="4471", date="14 March 2025"),
    dict(company="Bluefield Dental Group LLC", person="Marcus Okafor", city="Columbus, Ohio",
         street="1820 Olentangy River Road, OH 43212", ref="9023", date="2 June 2025"),
    dict(company="Kestrel Analytics Ltd", person="Priya Raman", city="Manchester",
         street="14 Whitworth Street West, M1 5WG", ref="3158", date="22 September 2025"),
    dict(company="Maple & Finch Bakery Inc.", person="Louis Tremblay", city="Montréal, Québec",
         street="5230 Boulevard Saint-Laurent, H2T 1S1", ref="6604", date="30 November 2025"),
]  # fmt: skip

EXTRACTION_SYSTEM = (
    "You are a data-extraction assistant. You read business documents and return the requested "
    "fields as a JSON object. Copy every value exactly as it is written in the document."
)

INVOICE = """NORTHWIND OFFICE SYSTEMS B.V.
Keizersgracht 512, 1017 EK Amsterdam, The Netherlands
VAT ID: NL853216479B01 | Chamber of Commerce: 71234580
Phone: +31 20 555 0142 | accounts@northwind-office.example

INVOICE

Invoice number: INV-2025-{ref}
Issue date: {date}
Due date: 30 days after the issue date
Purchase order: PO-{ref}-17
Customer account: CA-{ref}

Bill to:
{company}
Attn: {person}, Facilities Manager
{street} {city}

Ship to:
{company}, Loading Dock B
{street} {city}

Dear {person},

Thank you for your order. This invoice covers the office refurbishment package of our
quotation Q-2025-{ref}. The monitor arms and cabling follow within ten working days and are
invoiced here as agreed.

Line items:

1. SKU NW-DSK-1600 | Height-adjustable desk, 160 x 80 cm, oak veneer top, electric frame
   Quantity: 12 | Unit price: EUR 689.00 | Amount: EUR 8,268.00
2. SKU NW-CHR-220 | Ergonomic task chair with lumbar support, mesh back, grey
   Quantity: 12 | Unit price: EUR 412.50 | Amount: EUR 4,950.00
3. SKU NW-PED-3D | Mobile pedestal, three drawers, central lock, white
   Quantity: 12 | Unit price: EUR 149.00 | Amount: EUR 1,788.00
4. SKU NW-MA-DUO | Dual monitor arm, gas spring, VESA 75/100, black
   Quantity: 10 | Unit price: EUR 118.75 | Amount: EUR 1,187.50
5. SKU NW-CAB-KIT | Under-desk cable management kit with tray and spine
   Quantity: 12 | Unit price: EUR 39.90 | Amount: EUR 478.80
6. SKU NW-INST-H | Assembly and installation, per technician hour
   Quantity: 18 | Unit price: EUR 65.00 | Amount: EUR 1,170.00

Subtotal: EUR 17,842.30
Loyalty discount (5% on items 1-3): EUR -750.30
Net amount: EUR 17,092.00
VAT 21%: EUR 3,589.32
Total due: EUR 20,681.32

Payment terms: net 30 days. Please pay by bank transfer and quote the invoice number
INV-2025-{ref} as the payment reference, so that we can match your payment to this invoice.
Bank: ING Bank N.V., Amsterdam
IBAN: NL91 INGB 0004 3862 71
BIC: INGBNL2A
Account holder: Northwind Office Systems B.V.

Late payment: overdue amounts carry statutory commercial interest.

Returns and warranty: furniture carries a five-year warranty against manufacturing defects
from the date of delivery; moving parts (gas springs, electric frames) carry two years.
Unused items in their original packaging may be returned within 14 days of delivery for a
refund less a 10% restocking fee. To report a defect, contact
service@northwind-office.example and mention your customer account CA-{ref}.

Delivery notes: the first shipment was signed for by {person} at Loading Dock B. Two chair
boxes showed minor damage to the outer carton; the contents were inspected on site and found
undamaged. Packaging material was taken back by our driver for recycling.

Questions about this invoice: accounts@northwind-office.example, reference INV-2025-{ref}.
Northwind Office Systems B.V. thanks you for your business.
"""

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string"},
        "issue_date": {"type": "string"},
        "purchase_order": {"type": "string"},
        "vendor_name": {"type": "string"},
        "vendor_vat_id": {"type": "string"},
        "customer_name": {"type": "string"},
        "customer_contact": {"type": "string"},
        "total_due": {"type": "string"},
        "iban": {"type": "string"},
        "line_items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "amount": {"type": "string"},
                },
                "required": ["sku", "quantity", "amount"],
                "additionalProperties": False,
            },
        },
    },
    "required": [
        "invoice_number", "issue_date", "purchase_order", "vendor_name", "vendor_vat_id",
        "customer_name", "customer_contact", "total_due", "iban", "line_items",
    ],
    "additionalProperties": False,
}  # fmt: skip

INCIDENT = """POST-INCIDENT REVIEW: INC-{ref}
Organisation: {company}
Prepared by: {person}, incident commander
Review meeting: five working days after {date}
Status: final, blameless format

Summary

On {date}, between 09:42 and 11:27 local time ({city} office), the customer-facing
payments API returned errors for about 38% of requests. Card payments submitted through the
web checkout and the mobile app failed with HTTP 503 responses, and a smaller number of
requests timed out after 30 seconds. The incident was declared at severity SEV-2 at 09:51
and raised to SEV-1 at 10:05, when the error rate passed the 25% threshold defined in our
incident policy. Service was fully restored at 11:27, giving a total duration of 105
minutes. No payment was charged twice and no card data was exposed.

Impact

- 14,212 payment attempts failed; 9,870 of them were retried successfully by customers
  within the incident window.
- Estimated lost or delayed revenue: USD 186,400.
- 412 support tickets were opened, mostly through the in-app chat.
- Two enterprise customers invoked the service-credit clause of their agreements.

Timeline (local time)

09:38 Deployment 2025.11.3 of the payments-gateway service begins, rolling out a new version
      of the connection-pool library used to reach the primary database cluster pg-main-02.
09:42 Error rate on the payments API rises from 0.2% to 11%.
09:47 The on-call engineer, Tomás Herrera, is paged by the error-rate alert.
09:51 Incident declared at SEV-2; {person} takes the incident commander role.
09:58 The deployment is paused at 60% of instances. Errors continue on the upgraded hosts.
10:05 Error rate reaches 31%; severity raised to SEV-1; status page updated.
10:19 Database dashboards show connections to pg-main-02 at the hard limit of 2,000.
10:34 Root cause identified: the new library opens a pool per worker thread instead of
      per process, multiplying database connections by sixteen.
10:41 Rollback of deployment 2025.11.3 starts.
11:02 Rollback completes on all instances; connections fall to 640.
11:27 Error rate back at baseline for 20 minutes; incident resolved.

Root cause

The connection-pool library upgrade changed the default scope of pools from per process to
per thread. Our configuration did not set the scope explicitly, so each of the sixteen
worker threads on every gateway instance opened its own pool of up to 25 connections. The
database cluster reached its connection limit and refused new connections, and requests
waiting for a connection failed or timed out. The change was listed in the library's
release notes but was not noticed during review, and the staging environment runs only two
worker threads, so the effect did not appear in testing.

What went well

- The error-rate alert fired within five minutes of the first errors.
- The status page was updated within fourteen minutes of the incident being declared.
- Rollback was fully automated and needed no manual steps.

What went poorly

- It took 43 minutes to connect the database connection count with the deployment.
- The deployment pipeline does not halt automatically on a rising error rate.
- Staging does not match production's thread configuration.

Action items

1. Set the pool scope explicitly in the gateway configuration and add a test that counts
   connections per instance. Owner: Tomás Herrera. Due: 7 days after the review.
2. Add automatic rollback when the error rate exceeds 5% during a deployment. Owner:
   Aisha Bello. Due: 21 days after the review.
3. Run staging with the same worker-thread count as production. Owner: {person}. Due: 14
   days after the review.
4. Add a dashboard panel for database connections per service. Owner: Wen Li. Due: 10 days
   after the review.

Contact for questions about this review: {person}, incident commander, {company}.
"""

INCIDENT_SCHEMA = {
    "type": "object",
    "properties": {
        "incident_id": {"type": "string"},
        "organisation": {"type": "string"},
        "incident_commander": {"type": "string"},
        "on_call_engineer": {"type": "string"},
        "start_time": {"type": "string"},
        "resolved_time": {"type": "string"},
        "duration_minutes": {"type": "integer"},
        "highest_severity": {"type": "string"},
        "failed_payment_attempts": {"type": "integer"},
        "deployment": {"type": "string"},
        "database_cluster": {"type": "string"},
        "action_items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"owner": {"type": "string"}, "due": {"type": "string"}},
                "required": ["owner", "due"],
                "additionalProperties": False,
            },
        },
    },
    "required": [
        "incident_id", "organisation", "incident_commander", "on_call_engineer", "start_time",
        "resolved_time", "duration_minutes", "highest_severity", "failed_payment_attempts",
        "deployment", "database_cluster", "action_items",
    ],
    "additionalProperties": False,
}  # fmt: skip

CONTRACT = """MASTER SERVICES AGREEMENT
Agreement number: MSA-{ref}

This Master Services Agreement (the "Agreement") is made on {date} (the "Effective Date")
between:

(1) Lumen Cloud Services Inc., a Delaware corporation with its principal office at 400 Howard
    Street, Suite 1200, San Francisco, CA 94105, United States (the "Provider"); and

(2) {company}, with its registered office at {street} {city} (the "Client").

1. Services

1.1 The Provider shall provide the managed hosting, database administration and monitoring
services described in Order Form OF-{ref}-A (the "Services"). Each Order Form signed by both
parties forms part of this Agreement.

1.2 The Provider shall perform the Services with reasonable skill and care, in accordance
with good industry practice, and using appropriately qualified personnel.

2. Term

2.1 This Agreement begins on the Effective Date and continues for an initial term of
thirty-six (36) months (the "Initial Term").

2.2 After the Initial Term, this Agreement renews automatically for successive periods of
twelve (12) months unless either party gives written notice of non-renewal at least ninety
(90) days before the end of the then-current term.

3. Fees and payment

3.1 The Client shall pay a fixed monthly fee of USD 18,750.00 for the Services, plus any
usage charges set out in the Order Form.

3.2 The Provider shall invoice monthly in advance. The Client shall pay each undisputed
invoice within forty-five (45) days of the invoice date.

3.3 The Provider may increase the fees once per year, with sixty (60) days' written notice,
by no more than the lower of 4% and the annual change in the US Consumer Price Index.

4. Service levels

4.1 The Provider shall make the production environment available at least 99.95% of each
calendar month, excluding scheduled maintenance announced at least five (5) business days in
advance.

4.2 If availability falls below the commitment in clause 4.1, the Client is entitled to a
service credit of 5% of the monthly fee for each full 0.1% below the commitment, up to a
maximum of 30% of the monthly fee for that month.

5. Data protection

5.1 Each party shall comply with applicable data protection laws. The Provider shall process
personal data only on the Client's documented instructions, as set out in the Data
Processing Addendum attached as Schedule 2.

5.2 The Provider shall notify the Client without undue delay, and in any case within
forty-eight (48) hours, after becoming aware of a personal data breach affecting the Client's
data.

6. Liability

6.1 Neither party's total liability under this Agreement in any contract year shall exceed
the fees paid or payable by the Client in the twelve (12) months before the event giving rise
to the claim.

6.2 Nothing in this Agreement limits liability for fraud, death or personal injury caused by
negligence, or any liability that cannot be limited by law.

7. Termination

7.1 Either party may terminate this Agreement by written notice if the other party commits a
material breach and fails to remedy it within thirty (30) days of receiving notice of it.

7.2 On termination, the Provider shall return or delete the Client's data, at the Client's
choice, within sixty (60) days.

8. Governing law

This Agreement is governed by the laws of the State of New York, and the courts of New York
County have exclusive jurisdiction over any dispute arising from it.

Signed for and on behalf of Lumen Cloud Services Inc.: Danielle Foster, Chief Revenue Officer

Signed for and on behalf of {company}: {person}, authorised signatory
"""

CONTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "agreement_number": {"type": "string"},
        "effective_date": {"type": "string"},
        "provider": {"type": "string"},
        "client": {"type": "string"},
        "client_address": {"type": "string"},
        "order_form": {"type": "string"},
        "initial_term_months": {"type": "integer"},
        "non_renewal_notice_days": {"type": "integer"},
        "monthly_fee": {"type": "string"},
        "payment_days": {"type": "integer"},
        "availability_commitment": {"type": "string"},
        "breach_notification_hours": {"type": "integer"},
        "governing_law": {"type": "string"},
        "provider_signatory": {"type": "string"},
        "client_signatory": {"type": "string"},
    },
    "required": [
        "agreement_number", "effective_date", "provider", "client", "client_address",
        "order_form", "initial_term_months", "non_renewal_notice_days", "monthly_fee",
        "payment_days", "availability_commitment", "breach_notification_hours",
        "governing_law", "provider_signatory", "client_signatory",
    ],
    "additionalProperties": False,
}  # fmt: skip

CLAIM = """COMMERCIAL PROPERTY CLAIM: FIRST NOTICE OF LOSS AND ADJUSTER NOTES
Claim number: CLM-{ref}-WD
Policy number: CPP-7719-{ref}
Insurer: Atlas Mutual Insurance Company
Insured: {company}
Contact person: {person} (operations director)
Insured premises: {street} {city}
Date of loss: {date}
Reported: the day after the date of loss, by telephone, to the claims line
Assigned adjuster: Rebecca Lindqvist, senior property adjuster

1. Description of loss (as reported by the insured)

At about 02:15 on the date of loss, a braided water supply hose under the staff kitchen sink
on the first floor failed. Water ran for roughly five hours before the morning cleaning crew
found it at 07:20 and closed the isolation valve. Water spread across the first-floor
kitchen and the adjoining open-plan office, and leaked through the ceiling into the
ground-floor server room and reception area. The building's leak sensors were not connected
to the alarm panel, which had been upgraded in the spring.

2. Immediate actions taken by the insured

- Water supply isolated at 07:20; building electrician called at 07:35.
- Power to the server room cut at 07:50 as a precaution; servers shut down in order.
- Emergency drying contractor DryTech Restoration engaged at 09:10; 14 dehumidifiers and
  22 air movers installed by 13:00.
- Photographs and video of all affected areas taken before cleanup began.

3. Adjuster's site inspection

I inspected the premises two days after the date of loss together with {person}. The
failed hose was retained by the insured and is now held at our office as evidence; its
crimped fitting had separated from the braid. The hose was about eight years old and was not
covered by a maintenance contract. Moisture readings in the first-floor subfloor were still
between 28% and 35% on the day of inspection. The ground-floor ceiling tiles in the server
room and reception had collapsed in four places.

4. Damaged property and preliminary estimates

a) First-floor office carpet tiles, about 310 square metres: USD 21,700.00
b) Ground-floor suspended ceiling, tiles and grid: USD 8,450.00
c) Plasterboard walls, lower 60 cm, kitchen and office: USD 12,300.00
d) Server room: two network switches and one uninterruptible power supply: USD 17,980.00
e) Reception furniture: desk, two sofas, display cabinet: USD 9,140.00
f) Emergency drying and cleanup (DryTech invoice DT-88412): USD 11,265.00
g) Business interruption: three days of reduced operations, claimed by the insured:
   USD 46,000.00, subject to review by our forensic accountant

Total claimed: USD 126,835.00
Policy deductible: USD 5,000.00 per occurrence
Business interruption waiting period: 24 hours

5. Coverage position

Sudden and accidental discharge of water from a plumbing system is a covered cause of loss
under section B.2 of the policy. Wear and tear of the hose itself is excluded, but resulting
water damage is covered. The server equipment is covered under the electronic equipment
extension with a sub-limit of USD 50,000.00. The business interruption claim needs payroll
and sales records for the three months before the loss before it can be evaluated.

6. Next steps

- Insured to provide repair quotes from two contractors within 14 days.
- Forensic accountant Daniel Mbeki to review the business interruption claim.
- Subrogation against the hose manufacturer to be considered once the fitting is examined.
- Advance payment of USD 25,000.00 recommended for the emergency drying and urgent repairs.

Adjuster: Rebecca Lindqvist, Atlas Mutual Insurance Company
"""

CLAIM_SCHEMA = {
    "type": "object",
    "properties": {
        "claim_number": {"type": "string"},
        "policy_number": {"type": "string"},
        "insured": {"type": "string"},
        "contact_person": {"type": "string"},
        "premises": {"type": "string"},
        "date_of_loss": {"type": "string"},
        "cause_of_loss": {"type": "string"},
        "adjuster": {"type": "string"},
        "total_claimed": {"type": "string"},
        "deductible": {"type": "string"},
        "advance_payment": {"type": "string"},
        "damaged_property": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "estimate": {"type": "string"}},
                "required": ["item", "estimate"],
                "additionalProperties": False,
            },
        },
    },
    "required": [
        "claim_number", "policy_number", "insured", "contact_person", "premises",
        "date_of_loss", "cause_of_loss", "adjuster", "total_claimed", "deductible",
        "advance_payment", "damaged_property",
    ],
    "additionalProperties": False,
}  # fmt: skip

# (document template, its schema, what the request calls it)
DOCUMENTS = [
    (INVOICE, INVOICE_SCHEMA, "invoice"),
    (INCIDENT, INCIDENT_SCHEMA, "post-incident review"),
    (CONTRACT, CONTRACT_SCHEMA, "services agreement"),
    (CLAIM, CLAIM_SCHEMA, "insurance claim file"),
]

EXTRACTION_REQUEST = (
    "Extract these fields from the {kind} below: {fields}. Answer with one JSON object. Copy "
    "names, numbers, dates and amounts exactly as written.\n\n---\n{document}---"
)

CODE_SYSTEM = "You are an expert Python developer. You make exactly the change asked for."

RATE_LIMITER = '''import threading
import time
from dataclasses import dataclass


@dataclass
class LimiterStats:
    granted: int = 0
    rejected: int = 0
    waited_seconds: float = 0.0


class RateLimiter:
    """A token bucket: `rate` tokens a second, at most `capacity` saved up."""

    def __init__(self, rate, capacity, clock=time.monotonic):
        self.rate = rate
        self.capacity = capacity
        self.clock = clock
        self.tokens = capacity
        self.updated = clock()
        self.lock = threading.Lock()
        self.stats = LimiterStats()

    def _refill(self):
        now = self.clock()
        elapsed = now - self.updated
        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
        self.updated = now

    def try_acquire(self, tokens=1):
        """Take `tokens` if they are there; never waits."""
        with self.lock:
            self._refill()
            if self.tokens >= tokens:
                self.tokens -= tokens
                self.stats.granted += 1
                return True
            self.stats.rejected += 1
            return False

    def acquire(self, tokens=1):
        """Take `tokens`, waiting until the bucket holds them."""
        if tokens > self.capacity:
            raise ValueError(f"cannot acquire {tokens} tokens, capacity is {self.capacity}")
        start = self.clock()
        while True:
            with self.lock:
                self._refill()
                if self.tokens >= tokens:
                    self.tokens -= tokens
                    self.stats.granted += 1
                    self.stats.waited_seconds += self.clock() - start
                    return
                missing = tokens - self.tokens
            time.sleep(missing / self.rate)

    def available(self):
        with self.lock:
            self._refill()
            return self.tokens

    def reset(self):
        with self.lock:
            self.tokens = self.capacity
            self.updated = self.clock()
            self.stats = LimiterStats()


def send_all(messages, limiter, send):
    """Send every message, skipping those the limiter refuses; returns the skipped ones."""
    skipped = []
    for message in messages:
        if limiter.try_acquire():
            send(message)
        else:
            skipped.append(message)
    return skipped
'''

LOG_REPORT = '''import re
from collections import Counter, defaultdict
from datetime import datetime

LINE = re.compile(
    r'(?P<ip>\\S+) \\S+ \\S+ \\[(?P<time>[^\\]]+)\\] "(?P<method>[A-Z]+) (?P<path>\\S+) \\S+" '
    r'(?P<status>\\d{3}) (?P<size>\\d+|-) "(?P<referrer>[^"]*)" "(?P<agent>[^"]*)"'
)
TIME_FORMAT = "%d/%b/%Y:%H:%M:%S %z"


def parse_line(line):
    match = LINE.match(line)
    if match is None:
        return None
    record = match.groupdict()
    record["time"] = datetime.strptime(record["time"], TIME_FORMAT)
    record["status"] = int(record["status"])
    record["size"] = 0 if record["size"] == "-" else int(record["size"])
    return record


def summarize(path, top=10):
    """Read an nginx access log and summarize its traffic."""
    statuses = Counter()
    paths = Counter()
    bytes_by_ip = defaultdict(int)
    errors = []
    malformed = 0
    first = last = None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            record = parse_line(line)
            if record is None:
                malformed += 1
                continue
            statuses[record["status"]] += 1
            paths[record["path"]] += 1
            bytes_by_ip[record["ip"]] += record["size"]
            if record["status"] >= 500:
                errors.append((record["time"], record["path"], record["status"]))
            if first is None or record["time"] < first:
                first = record["time"]
            if last is None or record["time"] > last:
                last = record["time"]
    total = sum(statuses.values())
    heaviest = sorted(bytes_by_ip.items(), key=lambda item: item[1], reverse=True)[:top]
    return {
        "requests": total,
        "malformed_lines": malformed,
        "first_request": first,
        "last_request": last,
        "status_counts": dict(statuses),
        "error_rate": len(errors) / total if total else 0.0,
        "top_paths": paths.most_common(top),
        "top_clients_by_bytes": heaviest,
        "recent_errors": errors[-top:],
    }


def print_report(summary):
    print(f"requests: {summary['requests']} ({summary['malformed_lines']} malformed)")
    print(f"from {summary['first_request']} to {summary['last_request']}")
    print(f"error rate: {summary['error_rate']:.2%}")
    for path, count in summary["top_paths"]:
        print(f"{count:>8}  {path}")
    for ip, size in summary["top_clients_by_bytes"]:
        print(f"{size / 1e6:>8.1f} MB  {ip}")
'''

TTL_CACHE = '''import time
from collections import OrderedDict


class TTLCache:
    """A least-recently-used cache whose entries also expire `ttl` seconds after they are set."""

    def __init__(self, max_size=1024, ttl=300.0, on_evict=None, clock=time.monotonic):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        self.max_size = max_size
        self.ttl = ttl
        self.on_evict = on_evict
        self.clock = clock
        self._data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return self.get(key, _MISSING) is not _MISSING

    def get(self, key, default=None):
        entry = self._data.get(key)
        if entry is None:
            self.misses += 1
            return default
        value, expires = entry
        if expires < self.clock():
            self._evict(key)
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value

    def set(self, key, value, ttl=None):
        expires = self.clock() + (self.ttl if ttl is None else ttl)
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = (value, expires)
        while len(self._data) > self.max_size:
            oldest = next(iter(self._data))
            self._evict(oldest)

    def delete(self, key):
        if key in self._data:
            self._evict(key)
            return True
        return False

    def purge_expired(self):
        now = self.clock()
        expired = [key for key, (_, expires) in self._data.items() if expires < now]
        for key in expired:
            self._evict(key)
        return len(expired)

    def _evict(self, key):
        value, _ = self._data.pop(key)
        if self.on_evict is not None:
            self.on_evict(key, value)

    def hit_rate(self):
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


_MISSING = object()
'''

HTTP_RETRY = '''import logging
import random
import time

import requests

log = logging.getLogger(__name__)

RETRY_STATUSES = {429, 500, 502, 503, 504}


class FetchError(Exception):
    def __init__(self, url, attempts, last_error):
        super().__init__(f"{url}: gave up after {attempts} attempts: {last_error}")
        self.url = url
        self.attempts = attempts
        self.last_error = last_error


def backoff_delay(attempt, base=0.5, cap=30.0):
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * 2**attempt))


def fetch_json(session, url, params=None, attempts=5, timeout=10.0):
    """GET `url` and decode its JSON, retrying connection errors and retryable statuses."""
    last_error = None
    for attempt in range(attempts):
        try:
            response = session.get(url, params=params, timeout=timeout)
        except (requests.ConnectionError, requests.Timeout) as error:
            last_error = error
            log.warning("attempt %d for %s failed: %s", attempt + 1, url, error)
        else:
            if response.status_code == 200:
                return response.json()
            if response.status_code not in RETRY_STATUSES:
                response.raise_for_status()
            last_error = f"HTTP {response.status_code}"
            retry_after = response.headers.get("Retry-After")
            if retry_after is not None and retry_after.isdigit():
                log.info("%s asked us to wait %s seconds", url, retry_after)
                time.sleep(int(retry_after))
                continue
        if attempt + 1 < attempts:
            delay = backoff_delay(attempt)
            log.debug("sleeping %.2f seconds before retrying %s", delay, url)
            time.sleep(delay)
    raise FetchError(url, attempts, last_error)


def fetch_all_pages(session, url, page_size=100, max_pages=50):
    """Follow a paginated API until a page comes back short."""
    items = []
    for page in range(1, max_pages + 1):
        data = fetch_json(session, url, params={"page": page, "per_page": page_size})
        batch = data.get("items", [])
        items.extend(batch)
        if len(batch) < page_size:
            break
    else:
        log.warning("%s: stopped after %d pages", url, max_pages)
    return items
'''

# (the code, four edits asked of it)
CODE_EDITS = [
    (RATE_LIMITER, [
        "Rename the method try_acquire to acquire_nowait, and update its caller.",
        "Add a `timeout` parameter (default None) to acquire that raises TimeoutError when the "
        "tokens are not available within that many seconds.",
        "Make __init__ raise ValueError when rate or capacity is not positive.",
        "Add type hints to every function and method.",
    ]),
    (LOG_REPORT, [
        "Count requests per HTTP method in summarize and return them as 'method_counts'.",
        "Rename the function summarize to summarize_access_log.",
        "Make summarize skip requests whose path starts with '/health'.",
        "Add a `min_status` parameter to summarize (default 500) used instead of the fixed 500 "
        "when collecting errors.",
    ]),
    (TTL_CACHE, [
        "Add a `clear` method that evicts every entry (calling on_evict for each).",
        "Make set raise ValueError when ttl is negative.",
        "Rename the attribute _data to _entries everywhere.",
        "Add a `keys` method that returns the keys of the entries that have not expired.",
    ]),
    (HTTP_RETRY, [
        "Add 408 to the retryable statuses.",
        "Make fetch_json cap the Retry-After wait at 60 seconds.",
        "Rename fetch_all_pages to fetch_paginated and its parameter max_pages to page_limit.",
        "Make backoff_delay take the random number generator as a parameter `rng` (default "
        "the random module).",
    ]),
]  # fmt: skip

CODE_REQUEST = (
    "{edit} Return the complete updated file in one ```python block and nothing else.\n\n"
    "```python\n{code}```"
)

AGENT_SYSTEM = """You are the support agent of Cobalt Home, an online store for home appliances. \
You resolve a customer's ticket by calling tools, one call per turn. Each turn, answer with \
exactly one JSON object {"name": TOOL, "arguments": {...}}; the tool's result comes back in \
the next message. Tools:
- lookup_customer(email): the customer's id, name and recent orders.
- get_order(order_id): the order's items, amounts, payment and delivery status.
- issue_refund(order_id, amount, reason): refund an amount of an order to its payment method.
- send_email(to, subject, body): email the customer.
- close_ticket(ticket_id, resolution): close the ticket with a one-line resolution.
Refund only what the problem justifies, tell the customer what you did, then close the ticket.

Example, for ticket T-40001 from jo.lee@example.com about order CH-700001 (a kettle that
arrived broken), the five calls, each after the previous one's result:
{"name": "lookup_customer", "arguments": {"email": "jo.lee@example.com"}}
{"name": "get_order", "arguments": {"order_id": "CH-700001"}}
{"name": "issue_refund", "arguments": {"order_id": "CH-700001", "amount": 49.99, \
"reason": "kettle arrived broken"}}
{"name": "send_email", "arguments": {"to": "jo.lee@example.com", "subject": "Your refund \
for order CH-700001", "body": "Hello Jo, we have refunded 49.99 for the broken kettle. It \
reaches your card within 5 days."}}
{"name": "close_ticket", "arguments": {"ticket_id": "T-40001", "resolution": "Refunded \
49.99 for a kettle that arrived broken."}}"""

# A tool call: one of the tools above, with its arguments, as a constrained decoder enforces
# a chat request's `tools` (each tool an alternative of its own).
TOOL_CALL_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "name": {"const": name},
                "arguments": {
                    "type": "object",
                    "properties": {arg: {"type": kind} for arg, kind in args.items()},
                    "required": list(args),
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, args in {
            "lookup_customer": {"email": "string"},
            "get_order": {"order_id": "string"},
            "issue_refund": {"order_id": "string", "amount": "number", "reason": "string"},
            "send_email": {"to": "string", "subject": "string", "body": "string"},
            "close_ticket": {"ticket_id": "string", "resolution": "string"},
        }.items()
    ]
}

# (ticket, customer, email, order, item, price, what went wrong)
TICKETS = [
    ("T-50211", "Dana Whitfield", "dana.whitfield@example.com", "CH-880231",
     "Breville Smart Grinder Pro", 199.95, "the bean hopper arrived cracked"),
    ("T-50214", "Kenji Watanabe", "k.watanabe@example.net", "CH-880457",
     "Dyson V12 Detect Slim", 649.99, "the charging dock was missing from the box"),
    ("T-50219", "Amara Nwosu", "amara.nwosu@example.org", "CH-880512",
     "Instant Pot Duo Plus 6qt", 129.00, "it was charged twice on the card statement"),
    ("T-50223", "Lukas Brandt", "lukas.brandt@example.de", "CH-880634",
     "Bosch Series 8 dishwasher", 1149.00, "delivery came nine days after the promised date"),
    ("T-50230", "Sofia Esposito", "sofia.esposito@example.it", "CH-880701",
     "De'Longhi Dedica espresso machine", 279.90, "the steam wand leaks when switched on"),
    ("T-50236", "Ryan O'Connell", "ryan.oconnell@example.ie", "CH-880795",
     "Ninja Foodi dual air fryer", 219.99, "a different model was delivered"),
    ("T-50241", "Mei Chen", "mei.chen@example.com", "CH-880866",
     "Philips Hue starter kit", 179.99, "two of the three bulbs do not pair with the bridge"),
    ("T-50247", "Olumide Adeyemi", "o.adeyemi@example.ng", "CH-880903",
     "KitchenAid Artisan stand mixer", 449.00, "the mixing bowl was dented"),
    ("T-50252", "Hannah Kowalski", "hannah.k@example.pl", "CH-881020",
     "iRobot Roomba j7+", 799.00, "the base station stopped emptying the bin after a week"),
    ("T-50258", "Carlos Mendoza", "carlos.mendoza@example.mx", "CH-881144",
     "Vitamix E310 blender", 349.95, "the lid is missing its removable plug"),
    ("T-50263", "Aisha Rahman", "aisha.rahman@example.ae", "CH-881207",
     "Samsung Bespoke fridge water filter 3-pack", 89.97, "only two filters were in the pack"),
    ("T-50269", "Tom Eriksen", "tom.eriksen@example.no", "CH-881318",
     "Miele Complete C3 vacuum", 599.00, "the parcel was left outside in the rain"),
    ("T-50274", "Grace Mutua", "grace.mutua@example.ke", "CH-881402",
     "Smeg 2-slice toaster", 169.95, "the lever does not stay down"),
    ("T-50280", "Pierre Lambert", "pierre.lambert@example.fr", "CH-881533",
     "Nespresso Vertuo Next", 159.00, "a promised coupon for 50 capsules was not applied"),
    ("T-50287", "Yuki Tanaka", "yuki.tanaka@example.jp", "CH-881649",
     "Levoit Core 400S air purifier", 219.99, "the filter arrived without its seal bag"),
    ("T-50291", "Isabel Duarte", "isabel.duarte@example.pt", "CH-881770",
     "Cuisinart 14-cup food processor", 249.00, "the slicing disc was cracked on arrival"),
]  # fmt: skip

TICKET_MESSAGE = (
    "New ticket {ticket} from {email}: \"Hello, I'm {customer}. My order {order} ({item}) "
    'has a problem: {problem}. Can you help?" Resolve the ticket.'
)

# What the tools answer, step by step (every ticket goes through the same five calls; the
# answers repeat ids and amounts the next call copies, as real tool results do).
TOOL_RESULTS = [
    '{{"customer_id": "CU-{number}", "name": "{customer}", "email": "{email}", '
    '"member_since": "2021-04-18", "recent_orders": [{{"order_id": "{order}", '
    '"placed": "2025-10-03", "total": {price:.2f}}}, {{"order_id": "CH-77{number}", '
    '"placed": "2025-06-21", "total": 34.50}}]}}',
    '{{"order_id": "{order}", "status": "delivered", "delivered": "2025-10-09", '
    '"items": [{{"sku": "SKU-{number}", "name": "{item}", "quantity": 1, "price": {price:.2f}}}], '
    '"shipping": 0.00, "payment": {{"method": "visa", "last4": "4{number}", '
    '"captured": {price:.2f}}}, "refundable_amount": {price:.2f}}}',
    '{{"refund_id": "RF-{number}-1", "order_id": "{order}", "amount": {price:.2f}, '
    '"status": "pending", "expected_on_card_within_days": 5}}',
    '{{"status": "sent", "message_id": "msg-{number}-cobalt", "to": "{email}"}}',
]

# Open-ended: the reply is new text, little of it in the prompt.
FREE_TEXT = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how vaccines train the immune system, for a curious twelve-year-old.",
    "What are the trade-offs between renting and buying a home? Give a balanced answer.",
    "Write a poem about a city waking up in the early morning.",
    "Describe how a bill becomes a law in a parliamentary democracy.",
    "Give me a plan for learning to play the guitar in three months as a busy adult.",
    "Why do leaves change colour in autumn? Explain the chemistry simply.",
    "Write a letter from a retired astronaut to her younger self.",
    "Explain the difference between weather and climate, with examples.",
    "Suggest five themes for a community garden festival and describe each one.",
    "Tell the story of a small bakery that survives a difficult winter.",
    "How does compound interest work, and why does starting to save early matter?",
    "Describe a walk through a rainforest at dawn, focusing on the sounds.",
    "What makes a good team meeting? Give practical advice for a new manager.",
    "Write a fable about a fox and a crow that teaches a lesson about patience.",
    "Explain how a refrigerator keeps food cold, step by step.",
]
