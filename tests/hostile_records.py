"""Hostile request records in every dialect, and what the contract (docs/protocols.md) says becomes of each.

A record starts as a valid request of its dialect (a schedule, a replace, a cancel, or a write-back read
back) and then has some of its fields mutated, each at most once: removed, given a null value, duplicated,
given garbage (nonsense text, invalid UTF-8, NUL bytes, oversized), an out-of-range epoch, a truncated or
doctored Avro value, malformed JSON. A share of records is raw garbage instead. Each field ends in a state
(``ok``, ``absent``, ``bad``, ``dup``, ``unsure``) and the dialect's ``expect_*`` function maps the states to
the outcome the contract promises: ``request`` (with its action), ``reject``, or ``either`` when the
generator does not model the case exactly (raw garbage, flipped bits): those only have to end in exactly
one outcome.

The choices go through a ``Chooser``: ``RandomChooser`` (seeded, fast: the bulk tests and
``kafka-scheduler bench hostile``) or ``DrawChooser`` (hypothesis draws: shrinkable examples).
"""

from __future__ import annotations

import base64
import itertools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

from kafka_scheduler.protocol import DIALECT_NAMES

OK, ABSENT, BAD, DUP, UNSURE = "ok", "absent", "bad", "dup", "unsure"
REQUEST, REJECT, EITHER = "request", "reject", "either"

DIALECTS = DIALECT_NAMES

INVALID_UTF8 = (
    b"\xff",
    b"\xfe\xff",
    b"\x80",
    b"\xc3\x28",
    b"\xa0\xa1",
    b"\xe2\x28\xa1",
    b"\xf0\x28\x8c\xbc",
    b"\xed\xa0\x80",  # a UTF-16 surrogate
    b"\xc0\xaf",  # overlong '/'
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
    b"\xe2\x82",
)  # truncated sequence

SOURCE_OFFSET = "x-scheduler-source-offset"


# ---------------------------------------------------------------- choosing


class RandomChooser:
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence):
        return options[self.rng.randrange(len(options))]

    def raw(self, lo: int, hi: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(lo, hi))

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class DrawChooser:
    """Hypothesis draws (``st.data()``): examples shrink towards fewer mutations and smaller values."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, options: Sequence):
        return options[self.integer(0, len(options) - 1)]

    def raw(self, lo: int, hi: int) -> bytes:
        return self.data.draw(self.st.binary(min_size=lo, max_size=hi))

    def chance(self, p: float) -> bool:
        return self.integer(0, 999) >= 1000 - round(p * 1000)  # shrinks to False


# ---------------------------------------------------------------- the record and its context


@dataclass(frozen=True)
class Context:
    """What a generated record may refer to."""

    destinations: tuple[str, ...]  # valid destination topics (existing ones, in the integration tests)
    forbidden: tuple[str, ...]  # the app's own and input topics: never a destination
    max_value_bytes: int
    now_ms: int  # the record timestamp the decoder measures "too far ahead" from
    due_offsets_ms: tuple[int, ...] = (-86_400_000, -1000, 0, 500, 2000, 4000, 3_600_000, 10 * 365 * 86_400_000)
    huge_bytes: int = 20_000  # how big "huge" keys, ids and header values get
    ids: list = field(default_factory=list)  # ids used so far: some requests reuse one (replace, cancel)
    serial: itertools.count = field(default_factory=itertools.count)  # keeps new ids unique


@dataclass
class Hostile:
    dialect: str
    key: bytes | None
    value: bytes | None
    headers: list  # [(name, bytes or None)]
    expect: str = EITHER  # request | reject | either
    action: str | None = None  # the action of an expected request: ADD, REPLACE, CANCEL, COMPLETE
    why: str = ""

    def record(self) -> dict:
        return {"key": self.key, "value": self.value, "headers": self.headers}


@dataclass
class Draft:
    dialect: str
    action: str
    key: bytes | None
    value: bytes | None
    headers: list
    states: dict
    why: list = field(default_factory=list)
    document: dict | None = None  # sky: the schedule, before it is encoded

    def header_index(self, name: str) -> list[int]:
        return [i for i, (k, _) in enumerate(self.headers) if k.lower() == name.lower()]

    def set_header(self, name: str, value: bytes | None, chooser=None) -> None:
        """Replace the header's value (or add the header, at a random place)."""
        at = self.header_index(name)
        if at:
            self.headers[at[0]] = (self.headers[at[0]][0], value)
        else:
            position = chooser.integer(0, len(self.headers)) if chooser else len(self.headers)
            self.headers.insert(position, (name, value))

    def remove_header(self, name: str) -> None:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != name.lower()]

    def header(self, name: str) -> bytes | None:
        at = self.header_index(name)
        return self.headers[at[0]][1] if at else None


Chooser = "RandomChooser | DrawChooser"


def spelled(chooser, name: str) -> str:
    """Header names compare case-insensitively."""
    return chooser.choice([name, name, name.upper(), name.title()])


# ---------------------------------------------------------------- values


def new_id(chooser, ctx: Context) -> bytes:
    """A schedule id: mostly new, sometimes one used before (so replaces and cancels find something)."""
    if ctx.ids and chooser.chance(0.25):
        return chooser.choice(ctx.ids)
    tag = b"#%d" % next(ctx.serial)
    kind = chooser.integer(0, 9)
    made = (
        b"id" + tag
        if kind < 3
        else chooser.raw(1, 8) + tag
        if kind < 6
        else chooser.choice(INVALID_UTF8) + tag
        if kind < 8
        else b"\x00" + tag
        if kind == 8
        else b"x" * chooser.integer(100, ctx.huge_bytes) + tag
    )
    ctx.ids.append(made)
    return made


def payload(chooser, ctx: Context) -> bytes | None:
    kind = chooser.integer(0, 5)
    return (
        None
        if kind == 0
        else b""
        if kind == 1
        else chooser.raw(1, 32)
        if kind < 4
        else chooser.choice(INVALID_UTF8) + b"\x00" + chooser.raw(0, 8)
        if kind == 4
        else b"v" * chooser.integer(0, ctx.max_value_bytes)
    )  # at most the limit: fine


def oversized(chooser, ctx: Context) -> bytes:
    return b"o" * chooser.integer(
        ctx.max_value_bytes + 1, max(ctx.max_value_bytes + 1, min(4 * ctx.max_value_bytes, ctx.max_value_bytes + 5000))
    )


def garbage_text(chooser, valid: bytes) -> bytes:
    """Bytes that are not valid for a text field whose valid form is ``valid``: never a topic name, a number, an
    instant, an action, a version or a type."""
    kind = chooser.integer(0, 6)
    if kind == 0:
        return valid + chooser.choice(INVALID_UTF8)
    if kind == 1:
        return chooser.choice(INVALID_UTF8) + valid
    if kind == 2:
        return valid[:1] + b"\x00" + valid[1:]
    if kind == 3:
        return b"~" + chooser.raw(0, 12)
    if kind == 4:
        return valid + b" #" + chooser.raw(0, 4)
    if kind == 5:
        return b"\xef\xbb\xbf" + valid  # a BOM
    return b"\xff" * chooser.integer(1, 300)


def user_headers(chooser, reserved: tuple[str, ...]) -> list:
    """Headers no dialect reads (names outside ``reserved`` prefixes), null and binary values included."""
    names = [
        n
        for n in (
            "user",
            "trace",
            "",
            "Content-Type",
            "trace-\u00fc",
            "x-scheduler-extra",
            "schedule_extra",
            "scheduler-extra",
            "X-Scheduler-Delivery-Id",
        )
        if not n.lower().startswith(reserved)
    ]
    return [
        (chooser.choice(names), chooser.choice([None, b"", chooser.raw(0, 12), b"\xff\x00"]))
        for _ in range(chooser.integer(0, 3))
    ]


def destination(chooser, ctx: Context, draft: Draft, field_name: str) -> bytes:
    """Mutate a destination topic: returns the new text and sets the field's state."""
    kind = chooser.integer(0, 7)
    if kind == 0:
        draft.states[field_name] = BAD
        return chooser.choice(ctx.forbidden + ("__consumer_offsets", "__x")).encode()
    if kind == 1:
        draft.states[field_name] = BAD
        return chooser.choice(
            [
                b"a b",
                b".",
                b"..",
                b"t" * 250,
                b"ord\xffers",
                b"caf\xc3\xa9",
                b"t/x",
                b"t:x",
                b" " + ctx.destinations[0].encode(),
            ]
        )
    if kind == 2:
        draft.states[field_name] = BAD
        return garbage_text(chooser, ctx.destinations[0].encode())
    if kind == 3:
        draft.states[field_name] = OK  # a valid name that does not exist: dead-lettered by the sink, not here
        return b"nowhere-" + chooser.choice([b"a", b"b.c", b"d_e-f"]) + b"x" * chooser.integer(0, 200)
    if kind == 4:
        draft.states[field_name] = BAD  # empty: missing
        return b""
    draft.states[field_name] = OK
    return chooser.choice(ctx.destinations).encode()


def due_ms(chooser, ctx: Context) -> int:
    return ctx.now_ms + chooser.choice(ctx.due_offsets_ms) + chooser.integer(0, 999)


# ---------------------------------------------------------------- native


NATIVE_FIELDS = {
    "action": "x-scheduler-action",
    "to": "x-scheduler-deliver-to",
    "at": "x-scheduler-deliver-at",
    "id": "x-scheduler-request-id",
}


def iso(ms: int, chooser=None) -> bytes:
    """An ISO-8601 instant the native dialect reads as ``ms`` or later (never earlier)."""
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    kind = chooser.integer(0, 3) if chooser else 0
    if kind == 1:
        shifted = instant.astimezone(timezone(timedelta(hours=2)))
        return (shifted.strftime("%Y-%m-%dT%H:%M:%S.") + f"{shifted.microsecond // 1000:03d}+02:00").encode()
    if kind == 2:
        shifted = instant.astimezone(timezone(timedelta(hours=-5, minutes=-30)))
        return (shifted.strftime("%Y-%m-%dT%H:%M:%S.") + f"{shifted.microsecond // 1000:03d}" + "000001-0530").encode()
    return (instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z").encode()


def native_base(chooser, ctx: Context) -> Draft:
    action = chooser.choice(["ADD", "ADD", "REPLACE", "CANCEL"])
    headers = user_headers(chooser, ("x-scheduler-",))
    states = {"action": OK, "to": ABSENT, "at": ABSENT, "id": ABSENT, "value": OK}
    draft = Draft(
        "native", action, chooser.raw(0, 16) if chooser.chance(0.7) else None, payload(chooser, ctx), headers, states
    )
    if action != "ADD" or chooser.chance(0.5):
        draft.set_header(spelled(chooser, NATIVE_FIELDS["action"]), action.encode(), chooser)
    else:
        states["action"] = ABSENT
    if action != "CANCEL":
        draft.set_header(spelled(chooser, NATIVE_FIELDS["to"]), chooser.choice(ctx.destinations).encode(), chooser)
        draft.set_header(spelled(chooser, NATIVE_FIELDS["at"]), iso(due_ms(chooser, ctx), chooser), chooser)
        states["to"] = states["at"] = OK
    if action != "ADD" or chooser.chance(0.8):
        draft.set_header(spelled(chooser, NATIVE_FIELDS["id"]), new_id(chooser, ctx), chooser)
        states["id"] = OK
    return draft


def mutate_value(chooser, ctx: Context, draft: Draft) -> None:
    """A value over the limit (rejected) or another payload (accepted), for the dialects whose value is the
    delivered value as is."""
    if chooser.chance(0.5):
        draft.value = oversized(chooser, ctx)
        draft.states["value"] = BAD
    else:
        draft.value = payload(chooser, ctx)


def mutate_native(chooser, ctx: Context, draft: Draft, name: str) -> None:
    header = NATIVE_FIELDS.get(name)
    if name == "key":
        draft.key = chooser.choice([None, b"", chooser.raw(1, 64), b"k" * ctx.huge_bytes])
        return
    if name == "value":
        return mutate_value(chooser, ctx, draft)
    if name == "extra":
        for _ in range(chooser.integer(1, 4)):
            draft.headers.insert(
                chooser.integer(0, len(draft.headers)),
                (
                    chooser.choice(["x-scheduler-foo", "X-Scheduler-Delivery-Id", "noise"]),
                    chooser.choice([None, chooser.raw(0, 20), b"\x00" * ctx.huge_bytes]),
                ),
            )
        return
    kind = chooser.integer(0, 4)
    current = draft.header(header) or b""
    if kind == 0:  # removed
        draft.remove_header(header)
        draft.states[name] = ABSENT
    elif kind == 1:  # null value
        draft.remove_header(header)
        draft.set_header(spelled(chooser, header), None, chooser)
        draft.states[name] = ABSENT
    elif kind == 2:  # given twice (another value or the same)
        second = chooser.choice([current or b"1", garbage_text(chooser, current or b"x"), b""])
        draft.headers.insert(chooser.integer(0, len(draft.headers)), (spelled(chooser, header), second))
        if not draft.header_index(header)[1:]:
            draft.headers.append((header, current or b"1"))
        draft.states[name] = DUP
    elif name == "action":
        if kind == 3:
            spellings = [
                draft.action.encode().lower(),
                b" " + draft.action.encode() + b" ",
                draft.action.title().encode(),
            ]
            draft.set_header(header, chooser.choice(spellings), chooser)
            draft.states[name] = OK
        else:
            draft.set_header(
                header,
                chooser.choice(
                    [garbage_text(chooser, draft.action.encode()), b"DELETE", b"POSTPONE", b"\tADD", b"ADD\x00", b""]
                ),
                chooser,
            )
            draft.states[name] = BAD
    elif name == "to":
        draft.set_header(header, destination(chooser, ctx, draft, "to"), chooser)
    elif name == "at":
        if kind == 3:
            draft.set_header(header, iso(due_ms(chooser, ctx), chooser), chooser)  # another valid instant
            draft.states[name] = OK
        else:
            options = [
                (b"2300-01-01T00:00:00Z", BAD),  # more than 100 years ahead
                (b"99999-01-01T00:00:00Z", BAD),
                (b"2030-02-30T10:00:00Z", BAD),
                (b"2030-06-01T10:00:00", BAD),  # no zone
                (b"2030-06-01T10:00:00.1234567891Z", BAD),  # ten fraction digits
                (b"tomorrow", BAD),
                (garbage_text(chooser, iso(ctx.now_ms)), BAD),
                (b"", BAD),
                (b"1900-01-01T00:00:00Z", OK),  # long past: delivered at once
                (b"0001-01-01T00:00:00+18:00", UNSURE),
                (b"2030-06-01T10:00:00+25:00", UNSURE),
                (b"2030-06-01T10:00:00.5-00", UNSURE),
            ]
            text, state = chooser.choice(options)
            draft.set_header(header, text, chooser)
            draft.states[name] = state
    elif name == "id":
        if kind == 3:
            draft.set_header(header, b"", chooser)
            draft.states[name] = BAD
        else:
            draft.set_header(
                header,
                chooser.choice([new_id(chooser, ctx), b"\xff" * ctx.huge_bytes + b"#%d" % next(ctx.serial)]),
                chooser,
            )
            draft.states[name] = OK


def expect_native(draft: Draft) -> tuple[str, str | None]:
    s = draft.states
    reject, unsure = [], []
    if DUP in (s["action"], s["to"], s["at"], s["id"]):
        return REJECT, None
    if s["action"] == BAD:
        return REJECT, None
    action = "ADD" if s["action"] == ABSENT else draft.action
    if s["id"] == BAD:
        reject.append("empty id")
    if action in ("REPLACE", "CANCEL") and s["id"] == ABSENT:
        reject.append("missing id")
    if action in ("ADD", "REPLACE"):
        for name in ("to", "at", "value"):
            (unsure if s[name] == UNSURE else reject if s[name] != OK else []).append(name)
    if reject:
        return REJECT, None
    return (EITHER, None) if unsure else (REQUEST, action)


# ---------------------------------------------------------------- karafka


K = {
    "version": "schedule_schema_version",
    "type": "schedule_source_type",
    "epoch": "schedule_target_epoch",
    "topic": "schedule_target_topic",
    "target_key": "schedule_target_key",
    "partition": "schedule_target_partition",
    "partition_key": "schedule_target_partition_key",
    "ours": SOURCE_OFFSET,
    "theirs": "schedule_source_offset",
}
K_SCHEDULE_ONCE = ("epoch", "topic", "target_key", "partition", "partition_key")


def epoch_text(chooser, ms: int, fraction: bool) -> bytes:
    seconds = -(-ms // 1000)
    if fraction and chooser.chance(0.5):
        return f"{seconds - 1}.{chooser.choice(['5', '0015', '999999', '000'])}".encode()
    return str(seconds).encode()


def karafka_base(chooser, ctx: Context) -> Draft:
    action = chooser.choice(["ADD", "ADD", "ADD", "CANCEL", "COMPLETE"])
    states = dict.fromkeys(K, ABSENT) | {"key": OK, "value": OK, "version": OK, "type": OK}
    draft = Draft("karafka", action, new_id(chooser, ctx), payload(chooser, ctx), [], states)
    draft.headers += [
        (spelled(chooser, K["version"]), chooser.choice([b"1.0.0", b"1", b"1.2", b"1.0.7"])),
        (spelled(chooser, K["type"]), {"ADD": b"schedule", "CANCEL": b"cancel", "COMPLETE": b"tombstone"}[action]),
    ]
    if action == "ADD":
        draft.headers += [
            (spelled(chooser, K["epoch"]), epoch_text(chooser, due_ms(chooser, ctx), True)),
            (spelled(chooser, K["topic"]), chooser.choice(ctx.destinations).encode()),
        ]
        states["epoch"] = states["topic"] = OK
        for name, value in (
            ("target_key", chooser.raw(0, 8)),
            ("partition", str(chooser.integer(0, 3)).encode()),
            ("partition_key", chooser.raw(0, 8)),
        ):
            if chooser.chance(0.3):
                draft.headers.append((K[name], value))
                states[name] = OK
    elif action == "CANCEL":
        draft.value = None if chooser.chance(0.8) else draft.value
    else:
        draft.value = None
        for name in ("ours", "theirs"):
            if chooser.chance(0.6):
                draft.headers.append((K[name], str(chooser.integer(0, 10**6)).encode()))
                states[name] = OK
    draft.headers += user_headers(chooser, ("schedule_", "x-scheduler-"))
    return draft


def mutate_keyed_record_key(chooser, ctx: Context, draft: Draft) -> None:
    """Karafka, ETF1, Sky: the record key is the schedule id."""
    kind = chooser.integer(0, 3)
    if kind < 2:
        draft.key = None if kind == 0 else b""
        draft.states["key"] = BAD
    else:
        draft.key = chooser.choice([new_id(chooser, ctx), b"\xff" * ctx.huge_bytes + b"#%d" % next(ctx.serial)])
        draft.states["key"] = OK


def mutate_header_field(
    chooser, draft: Draft, header: str, name: str, valid: Callable[[], bytes], bad: Callable[[], tuple[bytes, str]]
) -> None:
    """Remove, null, duplicate, re-validate or spoil one header field."""
    kind = chooser.integer(0, 4)
    current = draft.header(header)
    if kind == 0:
        draft.remove_header(header)
        draft.states[name] = ABSENT
    elif kind == 1:
        draft.remove_header(header)
        draft.set_header(spelled(chooser, header), None, chooser)
        draft.states[name] = ABSENT
    elif kind == 2:
        first = current if current is not None else valid()
        draft.remove_header(header)
        draft.headers.insert(chooser.integer(0, len(draft.headers)), (spelled(chooser, header), first))
        draft.headers.insert(
            chooser.integer(0, len(draft.headers)),
            (spelled(chooser, header), chooser.choice([first, valid(), bad()[0]])),
        )
        draft.states[name] = DUP
    elif kind == 3:
        draft.set_header(spelled(chooser, header), valid(), chooser)
        draft.states[name] = OK
    else:
        value, state = bad()
        draft.set_header(spelled(chooser, header), value, chooser)
        draft.states[name] = state


def bad_epoch(chooser, ctx: Context, fraction_ok: bool) -> tuple[bytes, str]:
    options = [
        (b"-5", BAD),
        (b"-1.5", BAD),
        (b"soon", BAD),
        (b"1.8e9", BAD),
        (b"", BAD),
        (b" 1893456000", BAD),
        (b"0x70", BAD),
        (b"99999999999", BAD),  # year 5138: too far ahead
        (b"9" * 40, BAD),
        (b"9" * 40 + b".5", BAD),
        (garbage_text(chooser, b"1893456000"), BAD),
        (b"1893456000.", BAD),
        (b"0", OK),
    ]
    if not fraction_ok:
        options.append((b"1893456000.5", BAD))
    return chooser.choice(options)


def mutate_karafka(chooser, ctx: Context, draft: Draft, name: str) -> None:
    if name == "key":
        return mutate_keyed_record_key(chooser, ctx, draft)
    if name == "value":
        return mutate_value(chooser, ctx, draft)
    if name == "extra":
        draft.headers += [
            (chooser.choice(["schedule_other", "SCHEDULE_SOURCE_TOPIC", "noise"]), chooser.raw(0, 9))
            for _ in range(chooser.integer(1, 3))
        ]
        return
    header = K[name]
    valid: Callable[[], bytes]
    bad: Callable[[], tuple[bytes, str]]
    if name == "version":
        valid = lambda: chooser.choice([b"1", b"1.0", b"1.0.0", b"01.2.3"])
        bad = lambda: chooser.choice(
            [
                (b"2.0.0", BAD),
                (b"0.9", BAD),
                (b"v1", BAD),
                (b"1.0.0.0", BAD),
                (b"", BAD),
                (b"9" * 40, BAD),
                (garbage_text(chooser, b"1.0.0"), BAD),
            ]
        )
    elif name == "type":
        valid = lambda: {"ADD": b"schedule", "CANCEL": b"cancel", "COMPLETE": b"tombstone"}[draft.action]
        bad = lambda: chooser.choice(
            [
                (b"Schedule", BAD),
                (b"delete", BAD),
                (b"", BAD),
                (b" cancel", BAD),
                (garbage_text(chooser, b"schedule"), BAD),
            ]
        )
    elif name == "epoch":
        valid = lambda: epoch_text(chooser, due_ms(chooser, ctx), True)
        bad = lambda: bad_epoch(chooser, ctx, True)
    elif name == "topic":
        valid = lambda: chooser.choice(ctx.destinations).encode()
        bad = lambda: (destination(chooser, ctx, draft, "_scratch"), draft.states.pop("_scratch"))
    elif name in ("target_key", "partition_key"):
        valid = lambda: chooser.choice([b"", chooser.raw(1, 20), b"\xff" * 100])
        bad = lambda: (chooser.raw(0, 4), OK)  # any bytes are fine
    elif name == "partition":
        valid = lambda: chooser.choice([b"0", b"1", b"007", b"99", b"2147483647"])
        bad = lambda: chooser.choice(
            [
                (b"-1", BAD),
                (b"first", BAD),
                (b"2147483648", BAD),
                (b"99999999999", BAD),
                (b"", BAD),
                (b"1.0", BAD),
                (garbage_text(chooser, b"1"), BAD),
            ]
        )
    else:  # ours, theirs: offsets
        valid = lambda: chooser.choice([b"0", b"42", b"007", b"9223372036854775807"])
        bad = lambda: chooser.choice(
            [(b"-1", BAD), (b"3x", BAD), (b"", BAD), (b"9" * 20, BAD), (garbage_text(chooser, b"42"), BAD)]
        )
    mutate_header_field(chooser, draft, header, name, valid, bad)


def expect_karafka(draft: Draft) -> tuple[str, str | None]:
    s = draft.states
    if s["key"] != OK or s["version"] != OK or s["type"] != OK:
        return REJECT, None
    if draft.action == "ADD" and (
        any(s[n] not in (OK, ABSENT) for n in K_SCHEDULE_ONCE)
        or s["epoch"] != OK
        or s["topic"] != OK
        or s["value"] != OK
    ):
        return REJECT, None
    if draft.action == "COMPLETE" and (
        DUP in (s["ours"], s["theirs"]) or s["ours"] == BAD or (s["ours"] == ABSENT and s["theirs"] == BAD)
    ):
        return REJECT, None
    return REQUEST, draft.action


# ---------------------------------------------------------------- etf1


E = {
    "epoch": "scheduler-epoch",
    "topic": "scheduler-target-topic",
    "target_key": "scheduler-target-key",
    "ours": SOURCE_OFFSET,
}


def etf1_base(chooser, ctx: Context) -> Draft:
    action = chooser.choice(["ADD", "ADD", "ADD", "CANCEL", "COMPLETE"])
    states = dict.fromkeys(E, ABSENT) | {"key": OK, "value": OK}
    draft = Draft(
        "etf1", action, new_id(chooser, ctx), None, user_headers(chooser, ("scheduler-", "x-scheduler-")), states
    )
    if action == "ADD":
        draft.value = chooser.choice([b"", chooser.raw(1, 40), b"v" * ctx.max_value_bytes])
        draft.headers += [
            (spelled(chooser, E["epoch"]), epoch_text(chooser, due_ms(chooser, ctx), False)),
            (spelled(chooser, E["topic"]), chooser.choice(ctx.destinations).encode()),
        ]
        states["epoch"] = states["topic"] = OK
        if chooser.chance(0.5):
            draft.headers.append((E["target_key"], chooser.raw(0, 10)))
            states["target_key"] = OK
    elif action == "COMPLETE":
        draft.headers.append((SOURCE_OFFSET, str(chooser.integer(0, 10**6)).encode()))
        states["ours"] = OK
    return draft


def mutate_etf1(chooser, ctx: Context, draft: Draft, name: str) -> None:
    if name == "key":
        return mutate_keyed_record_key(chooser, ctx, draft)
    if name == "value":  # a null value turns a schedule into a cancel (or a write-back); a value does the reverse
        kind = chooser.integer(0, 2)
        draft.value = None if kind == 0 else oversized(chooser, ctx) if kind == 1 else payload(chooser, ctx)
        draft.states["value"] = BAD if kind == 1 else OK
        return
    if name == "extra":
        draft.headers += [
            (chooser.choice(["scheduler-other", "Scheduler-Timestamp", "noise"]), chooser.raw(0, 9))
            for _ in range(chooser.integer(1, 3))
        ]
        return
    if name == "epoch":
        valid = lambda: epoch_text(chooser, due_ms(chooser, ctx), False)
        bad = lambda: bad_epoch(chooser, ctx, False)
    elif name == "topic":
        valid = lambda: chooser.choice(ctx.destinations).encode()
        bad = lambda: (destination(chooser, ctx, draft, "_scratch"), draft.states.pop("_scratch"))
    elif name == "target_key":
        valid = lambda: chooser.raw(0, 20)
        bad = lambda: (b"\xff" * chooser.integer(0, 50), OK)
    else:
        valid = lambda: chooser.choice([b"0", b"42", b"9223372036854775807"])
        bad = lambda: chooser.choice([(b"-1", BAD), (b"3x", BAD), (b"", BAD), (b"9" * 19, BAD), (b"9" * 20, BAD)])
    mutate_header_field(chooser, draft, E[name], name, valid, bad)


def expect_etf1(draft: Draft) -> tuple[str, str | None]:
    s = draft.states
    if s["key"] != OK:
        return REJECT, None
    if draft.value is not None:
        if (
            any(s[n] == DUP for n in ("epoch", "topic", "target_key"))
            or s["epoch"] != OK
            or s["topic"] != OK
            or s["value"] != OK
        ):
            return REJECT, None
        return REQUEST, "ADD"
    ours = draft.header(SOURCE_OFFSET)
    if ours is None:
        # no text (absent or a null first value): a cancel; a duplicate does not matter then
        return REQUEST, "CANCEL"
    if s["ours"] in (DUP, BAD):
        return REJECT, None
    return REQUEST, "COMPLETE"


# ---------------------------------------------------------------- sky (both)


SKY_EXPIRED = "schedule:expired"


def sky_base(chooser, ctx: Context, dialect: str) -> Draft:
    action = chooser.choice(["ADD", "ADD", "ADD", "CANCEL", "COMPLETE"])
    states = {
        "key": OK,
        "expired": ABSENT,
        "ours": ABSENT,
        "time": OK,
        "topic": OK,
        "skey": OK,
        "svalue": OK,
        "headers": OK,
        "shape": OK,
    }
    draft = Draft(
        dialect, action, new_id(chooser, ctx), None, user_headers(chooser, ("x-scheduler-", "schedule:")), states
    )
    if action == "ADD":
        names = chooser.choice([[], ["a"], ["content-type", "trace"], [f"h{i}" for i in range(30)]])
        draft.document = {
            "time": due_ms(chooser, ctx),
            "topic": chooser.choice(ctx.destinations),
            "key": chooser.raw(0, 12),
            "value": payload(chooser, ctx),
            "headers": {n: chooser.raw(0, 8) for n in names},
        }
    elif action == "COMPLETE":
        draft.headers += [(spelled(chooser, SKY_EXPIRED), chooser.choice([b"true", b"TRUE", b" true "]))]
        states["expired"] = OK
        if chooser.chance(0.7):
            draft.headers.append((SOURCE_OFFSET, str(chooser.integer(0, 10**6)).encode()))
            states["ours"] = OK
    return draft


def mutate_sky_record(chooser, ctx: Context, draft: Draft, name: str) -> None:
    if name == "key":
        return mutate_keyed_record_key(chooser, ctx, draft)
    if name == "expired":
        valid = lambda: chooser.choice([b"true", b"True"])
        bad = lambda: chooser.choice([(b"false", BAD), (b"yes", BAD), (b"", BAD)])
        mutate_header_field(chooser, draft, SKY_EXPIRED, "expired", valid, bad)
    elif name == "ours":
        valid = lambda: chooser.choice([b"0", b"42", b"9223372036854775807"])
        bad = lambda: chooser.choice([(b"-1", BAD), (b"3x", BAD), (b"", BAD), (b"9" * 19, BAD), (b"9" * 20, BAD)])
        mutate_header_field(chooser, draft, SOURCE_OFFSET, "ours", valid, bad)
    elif name == "null":  # the record's value: a schedule becomes a cancel or a write-back
        draft.document = None


def mutate_sky_schedule(chooser, ctx: Context, draft: Draft, name: str) -> None:
    """The fields of the schedule in the value (before it is encoded)."""
    doc = draft.document
    if doc is None:
        return
    if name == "time":
        value, state = chooser.choice(
            [
                (-5, BAD),
                (-1, BAD),
                (2**62, BAD),
                (2**63 - 1, BAD),
                (ctx.now_ms + 200 * 365 * 86_400_000, BAD),
                (0, OK),
                (due_ms(chooser, ctx), OK),
            ]
        )
        doc["time"] = value
        draft.states["time"] = state
    elif name == "topic":
        doc["topic"] = destination(chooser, ctx, draft, "topic").decode("utf-8", "surrogateescape")
    elif name == "skey":
        doc["key"] = chooser.choice([b"", b"\xff" * ctx.huge_bytes, chooser.raw(0, 30)])
    elif name == "svalue":
        if chooser.chance(0.5):
            doc["value"] = oversized(chooser, ctx)
            draft.states["svalue"] = BAD
        else:
            doc["value"] = payload(chooser, ctx)
    elif name == "headers":
        doc["headers"] = chooser.choice(
            [{}, {"x": b"\xff" * ctx.huge_bytes}, {f"h{i}": str(i).encode() for i in range(chooser.integer(0, 2000))}]
        )


def expect_sky(draft: Draft) -> tuple[str, str | None]:
    s = draft.states
    if s["key"] != OK:
        return REJECT, None
    if draft.value is None:
        if DUP in (s["expired"], s["ours"]):
            return REJECT, None
        expired = (draft.header(SKY_EXPIRED) or b"").strip(b" ").lower() == b"true"
        if not expired:
            return REQUEST, "CANCEL"
        return (REJECT, None) if s["ours"] == BAD else (REQUEST, "COMPLETE")
    states = [s[n] for n in ("shape", "time", "topic", "skey", "svalue", "headers")]
    if BAD in states:
        return REJECT, None
    return (EITHER, None) if UNSURE in states else (REQUEST, "ADD")


# ---------------------------------------------------------------- sky-avro


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def avro_bytes(data: bytes) -> bytes:
    return zigzag(len(data)) + data


def avro_schedule(doc: dict, with_headers: bool = True, header_names: list | None = None) -> bytes:
    """The AvroSchedule record in Avro binary, written out by hand (fastavro refuses invalid UTF-8 names)."""
    topic = doc["topic"].encode("utf-8", "surrogateescape") if isinstance(doc["topic"], str) else doc["topic"]
    out = zigzag(doc["time"]) + avro_bytes(topic) + avro_bytes(doc["key"])
    out += b"\x00" if doc["value"] is None else b"\x02" + avro_bytes(doc["value"])
    if with_headers:
        entries = header_names if header_names is not None else [(n.encode(), v) for n, v in doc["headers"].items()]
        if entries:
            out += zigzag(len(entries)) + b"".join(avro_bytes(n) + avro_bytes(v) for n, v in entries)
        out += b"\x00"
    return out


def mutate_avro(chooser, ctx: Context, draft: Draft, name: str) -> None:
    """Doctor the encoding itself (the schedule's fields are mutated before)."""
    doc = draft.document
    if doc is None:
        return
    full = avro_schedule(doc)
    older = avro_schedule(doc, with_headers=False)
    kind = chooser.integer(0, 8)
    s = draft.states
    if kind == 0:  # truncated: only the older schema's exact length is a valid (older) schedule
        cut = chooser.integer(0, len(full) - 1)
        draft.value = full[:cut]
        s["shape"] = OK if cut == len(older) and cut > 0 else BAD
        if s["shape"] == OK:
            s["headers"] = OK
    elif kind == 1:  # trailing bytes
        draft.value = full + chooser.raw(1, 8)
        s["shape"] = BAD
    elif kind == 2:  # a length prefix or block count claiming far more than there is
        huge = chooser.choice([2**31 - 9, 2**31 - 1, 2**40, 2**62, 2**30])
        where = chooser.integer(0, 2)
        time_part = zigzag(doc["time"])
        topic = doc["topic"].encode("utf-8", "surrogateescape")
        if where == 0:
            draft.value = time_part + zigzag(huge) + topic
        elif where == 1:
            draft.value = time_part + avro_bytes(topic) + zigzag(huge) + b"k"
        else:
            draft.value = older + zigzag(huge) + avro_bytes(b"n") + avro_bytes(b"v") + b"\x00"
        s["shape"] = BAD
    elif kind == 3:  # negative lengths
        draft.value = zigzag(doc["time"]) + zigzag(-chooser.integer(1, 2**31)) + b"x" * 8
        s["shape"] = BAD
    elif kind == 4:  # a header name that is not UTF-8, or the same name twice (the map keeps one: shorter)
        entries = (
            [(chooser.choice([b"na\xffme", b"\xc3\x28", b"\xff"]), b"v")]
            if chooser.chance(0.5)
            else [(b"same", b"1"), (b"same", b"2")]
        )
        draft.value = avro_schedule(doc, header_names=entries)
        s["headers"] = BAD
    elif kind == 5:  # a map written in two blocks, or with a negative block count: valid Avro, not canonical
        entries = [(n.encode(), v) for n, v in doc["headers"].items()] or [(b"a", b"1")]
        body = b"".join(avro_bytes(n) + avro_bytes(v) for n, v in entries)
        draft.value = older + zigzag(-len(entries)) + zigzag(len(body)) + body + b"\x00"
        s["shape"] = BAD
    elif kind == 6:  # bits flipped: anything may come of it
        value = bytearray(full)
        for _ in range(chooser.integer(1, 3)):
            value[chooser.integer(0, len(value) - 1)] ^= 1 << chooser.integer(0, 7)
        draft.value = bytes(value)
        s["shape"] = UNSURE
    elif kind == 7:  # the older schema, as it is: valid
        draft.value = older
        s["headers"] = OK
    else:  # empty, or a single byte
        draft.value = chooser.choice([b"", b"\x00", b"\x02"])
        s["shape"] = BAD


# ---------------------------------------------------------------- sky-json


def json_document(doc: dict) -> dict:
    b64 = lambda data: base64.b64encode(data).decode()
    return {
        "time": doc["time"],
        "topic": doc["topic"],
        "key": b64(doc["key"]),
        "value": None if doc["value"] is None else b64(doc["value"]),
        "headers": {n: b64(v) for n, v in doc["headers"].items()},
    }


def mutate_json(chooser, ctx: Context, draft: Draft, name: str) -> None:
    doc = draft.document
    if doc is None:
        return
    s = draft.states
    fields = json_document(doc)
    kind = chooser.integer(0, 11)
    pretty = chooser.chance(0.2)
    raw_text: bytes | None = None
    if kind == 0:  # a required field missing
        missing = chooser.choice(["time", "topic", "key"])
        del fields[missing]
        s["shape"] = BAD
    elif kind == 1:  # optional fields missing or null: no value to deliver is never too large
        for optional in ("value", "headers"):
            if chooser.chance(0.5):
                if chooser.chance(0.5):
                    del fields[optional]
                else:
                    fields[optional] = None
                s["svalue" if optional == "value" else "headers"] = OK
    elif kind == 2:  # fields of the wrong type (None: the field's state stands)
        target, value, state = chooser.choice(
            [
                ("time", str(fields["time"]), None),  # digits in a string are read as the number
                ("time", 1.5, BAD),
                ("time", True, BAD),
                ("time", {"ms": 1}, BAD),
                ("time", [1], BAD),
                ("time", "9" * 5000, BAD),  # more digits than a long holds: too far ahead
                ("key", 12, UNSURE),
                ("key", "not base64!", BAD),
                ("value", "a b", BAD),
                ("value", "%%", BAD),
                ("headers", ["a"], BAD),
                ("headers", "text", BAD),
                ("headers", {"x": "%%"}, BAD),
                ("headers", {"x": None}, None),
                ("headers", {"x": 5}, UNSURE),
                ("topic", 123, UNSURE),
                ("key", None, BAD),
            ]
        )
        fields[target] = value
        if target == "value":
            s["svalue"] = OK  # replaced: whatever it was, it is not too large now
        if state is not None:
            s["shape"] = state
    elif kind == 3:  # extra fields, deep nesting among them
        depth = chooser.choice([1, 10, 200, 2000, 20000])
        fields["extra"] = json.loads("[" * min(depth, 200) + "]" * min(depth, 200)) if depth <= 200 else None
        if depth > 200:
            raw_text = (json.dumps(fields)[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}").encode()
            s["shape"] = UNSURE
    elif kind == 4:  # truncated text
        text = json.dumps(fields).encode()
        raw_text = text[: chooser.integer(0, len(text) - 1)]
        s["shape"] = BAD
    elif kind == 5:  # text after the object
        raw_text = json.dumps(fields).encode() + chooser.choice([b"x", b"{}", b' {"a":1}', b",", b"]", b"\x00"])
        s["shape"] = BAD
    elif kind == 6:  # not an object
        raw_text = chooser.choice(
            [b"[]", b"[" + json.dumps(fields).encode() + b"]", b"null", b"42", b'"x"', b"", b"true", b"{", b"}"]
        )
        s["shape"] = BAD
    elif kind == 7:  # invalid UTF-8 inside the topic or the key
        text = json.dumps(fields).encode()
        target = b'"topic": "' if chooser.chance(0.5) else b'"key": "'
        raw_text = text.replace(target, target + chooser.choice(INVALID_UTF8), 1)
        s["shape"] = BAD
    elif kind == 8:  # a field given twice
        text = json.dumps(fields)
        raw_text = (text[:-1] + ', "time": ' + json.dumps(chooser.choice([-1, 5, "x"])) + "}").encode()
        s["shape"] = s["time"] = UNSURE  # which one counts is the parser's business
    elif kind == 9:  # a huge number: in an unknown field, or as the time (more digits than Jackson reads)
        long_digits = "1" * chooser.choice([2000, 100_000])
        if chooser.chance(0.5):
            digits = chooser.choice(["1" * 10, long_digits])
            raw_text = (json.dumps(fields)[:-1] + ', "n": ' + digits + "}").encode()
            s["shape"] = UNSURE
        else:
            fields["time"] = 0
            raw_text = json.dumps(fields).replace('"time": 0', '"time": 9' + long_digits, 1).encode()
            s["shape"] = BAD
    elif kind == 10:  # surrounding white space, a byte order mark
        raw_text = chooser.choice([b" ", b"\n", b"\xef\xbb\xbf"]) + json.dumps(fields, indent=2).encode() + b"\n"
        s["shape"] = UNSURE
    else:  # valid, written with another layout
        pretty = True
    if raw_text is None:
        raw_text = json.dumps(fields, indent=2 if pretty else None).encode()
    draft.value = raw_text


# ---------------------------------------------------------------- assembly


BASES = {
    "native": native_base,
    "karafka": karafka_base,
    "etf1": etf1_base,
    "sky-avro": lambda c, x: sky_base(c, x, "sky-avro"),
    "sky-json": lambda c, x: sky_base(c, x, "sky-json"),
}
FIELDS = {
    "native": ["action", "to", "at", "id", "key", "value", "extra"],
    "karafka": [
        "key",
        "version",
        "type",
        "epoch",
        "topic",
        "target_key",
        "partition",
        "partition_key",
        "ours",
        "theirs",
        "value",
        "extra",
    ],
    "etf1": ["key", "epoch", "topic", "target_key", "ours", "value", "extra"],
    "sky-avro": ["key", "expired", "ours", "null", "time", "topic", "skey", "svalue", "headers", "encoding"],
    "sky-json": ["key", "expired", "ours", "null", "time", "topic", "skey", "svalue", "headers", "encoding"],
}
EXPECT = {
    "native": expect_native,
    "karafka": expect_karafka,
    "etf1": expect_etf1,
    "sky-avro": expect_sky,
    "sky-json": expect_sky,
}


def mutate(chooser, ctx: Context, draft: Draft, name: str) -> None:
    dialect = draft.dialect
    if dialect == "native":
        mutate_native(chooser, ctx, draft, name)
    elif dialect == "karafka":
        mutate_karafka(chooser, ctx, draft, name)
    elif dialect == "etf1":
        mutate_etf1(chooser, ctx, draft, name)
    elif name in ("key", "expired", "ours", "null"):
        mutate_sky_record(chooser, ctx, draft, name)
    elif name != "encoding":
        mutate_sky_schedule(chooser, ctx, draft, name)


def raw_garbage(chooser, ctx: Context, dialect: str) -> Hostile:
    """Random key, value and headers, the dialect's header names among them: anything may come of it."""
    names = {
        "native": list(NATIVE_FIELDS.values()),
        "karafka": list(K.values()),
        "etf1": list(E.values()),
        "sky-avro": [SKY_EXPIRED, SOURCE_OFFSET],
        "sky-json": [SKY_EXPIRED, SOURCE_OFFSET],
    }[dialect]
    headers = [
        (chooser.choice(names + ["x", ""]), chooser.choice([None, chooser.raw(0, 24)]))
        for _ in range(chooser.integer(0, 6))
    ]
    value = chooser.choice([None, chooser.raw(0, 64), b"{" + chooser.raw(0, 30) + b"}", b"\x00" * 3])
    return Hostile(
        dialect, chooser.choice([None, b"", chooser.raw(1, 16)]), value, headers, EITHER, None, "raw garbage"
    )


def hostile(chooser, ctx: Context, dialect: str, garbage_share: float = 0.1, max_mutations: int = 3) -> Hostile:
    """One record of ``dialect``: a valid request with up to ``max_mutations`` fields mutated (each once), or
    (``garbage_share``) raw garbage."""
    if chooser.chance(garbage_share):
        return raw_garbage(chooser, ctx, dialect)
    draft = BASES[dialect](chooser, ctx)
    fields = list(FIELDS[dialect])
    chosen = []
    for _ in range(chooser.integer(0, max_mutations)):
        name = chooser.choice(fields)
        fields.remove(name)
        chosen.append(name)
        mutate(chooser, ctx, draft, name)
    if dialect in ("sky-avro", "sky-json"):
        if draft.document is not None:
            draft.value = (
                avro_schedule(draft.document)
                if dialect == "sky-avro"
                else json.dumps(json_document(draft.document)).encode()
            )
            if "encoding" in chosen:
                (mutate_avro if dialect == "sky-avro" else mutate_json)(chooser, ctx, draft, "encoding")
            # the size limit applies to the value to deliver, which the doctoring above may have lost
        else:
            draft.value = None
    expect, action = EXPECT[dialect](draft)
    return Hostile(
        dialect,
        draft.key,
        draft.value,
        draft.headers,
        expect,
        action,
        f"{draft.action} with {', '.join(chosen) or 'nothing'} mutated",
    )
