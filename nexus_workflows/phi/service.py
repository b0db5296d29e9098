"""``encode``, ``decode`` and ``encode_text``: pseudonymise a conversation's PHI.

Concurrency rules (after the seeds' tokenMapService): a value's token is found by its
lookup key; a new value takes the map's next sequence number by compare-and-set
(``UPDATE … WHERE sequence = n``) and inserts its row in the same transaction (a savepoint
inside the caller's). A writer that loses — the sequence moved, or the unique constraint
on (map, lookup key) refused its row, which rolls its number back — reads the tokens
allocated since, adopts the value's token if another writer made it, and otherwise
tries the next number. So one value never gets two tokens, one token never two values,
and numbers have no gaps. A richer surface replaces the stored one by compare-and-set
on the stored ciphertext.

Every argument is validated before anything is read or written. Logs and exception
messages name maps by id and tokens by token, never a value, surface or code.
"""

# Long module: encode/decode and the token writer (its SQL is in nexus_workflows.sql).

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import FilteredRelation, Max, Q
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from nexus_workflows.conf import app_settings
from nexus_workflows.phi.cache import MapState, TokenRow, token_cache
from nexus_workflows.phi.exceptions import InvalidPhiValue, InvalidSpan, InvalidText, TokenAllocationError
from nexus_workflows.phi.keys import code_hash, keyring
from nexus_workflows.phi.models import PhiToken, TokenMap
from nexus_workflows.phi.normalization import (
    check_category,
    is_richer,
    normalize_text,
    surface_form,
    value_text,
)
from nexus_workflows.phi.recognizers import find as recognize
from nexus_workflows.phi.recognizers import resolve
from nexus_workflows.phi.tokens import TOKEN_PATTERN, check_code, make_token
from nexus_workflows.sql import postgresql

logger = logging.getLogger(__name__)

# Rounds of "look for the value, then compare-and-set the sequence" before giving up.
# Each lost round means another writer allocated a token, so this bounds contention,
# not a retry delay.
_ALLOCATION_ROUNDS = 200
# Seconds a map counts as contended after this process lost a claim on it.
_CONTENDED_FOR = 1.0
# Rounds of surface compare-and-set; each loss means another writer stored a surface.
_UPGRADE_ROUNDS = 20


def _connection() -> BaseDatabaseWrapper:
    return connections[router.db_for_write(TokenMap)]


def _load(alias: str, code: str) -> MapState:
    """One query: the map and all its tokens (a LEFT JOIN, so an empty map loads too)."""
    rows = (
        TokenMap.objects.using(alias)
        .for_code(code)
        .values_list(
            "pk", "sequence", "tokens__pk", "tokens__token", "tokens__lookup_key", "tokens__encrypted_surface"
        )
    )
    state: MapState | None = None
    for map_pk, sequence, pk, token, lookup_key, ciphertext in rows:
        if state is None:
            state = MapState(map_id=map_pk, sequence=sequence)
        if pk is not None:
            state.add(TokenRow(pk, token, lookup_key, ciphertext))
    return state if state is not None else MapState(map_id=None, sequence=0)


class _Publication:
    """What one write teaches the cache, applied to the shared state once committed.

    Registered with ``transaction.on_commit``: in autocommit mode it runs at once; inside
    a transaction it waits for the commit and is dropped by a rollback (of the
    transaction or of the savepoint it was made in). Until then the pending publications
    in ``connection.run_on_commit`` are also how a transaction sees its own writes.
    """

    __slots__ = ("key", "map_id", "rows", "sequence", "spelling", "token")

    def __init__(
        self,
        key: tuple[str, str],
        *,
        rows: tuple[TokenRow, ...] = (),
        map_id: int | None = None,
        sequence: int | None = None,
        spelling: tuple[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self.key = key
        self.rows = rows
        self.map_id = map_id
        self.sequence = sequence
        self.spelling = spelling
        self.token = token

    def apply_to(self, state: MapState) -> None:
        if self.map_id is not None:
            state.map_id = self.map_id
        if self.sequence is not None and self.sequence > state.sequence:
            state.sequence = self.sequence
        for row in self.rows:
            state.add(row)
        if self.spelling is not None and self.token is not None:
            state.spellings[self.spelling] = self.token

    def __call__(self) -> None:
        state = token_cache.peek(self.key)
        if state is not None:
            self.apply_to(state)


def _pending_publications(connection: BaseDatabaseWrapper, key: tuple[str, str]) -> list[_Publication]:
    return [
        entry[1]
        for entry in getattr(connection, "run_on_commit", ())
        if isinstance(entry[1], _Publication) and entry[1].key == key
    ]


def _in_manual_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Autocommit turned off (``transaction.set_autocommit(False)``) outside any atomic
    block: writes wait for the caller's commit or rollback, which Django's on_commit
    cannot follow there."""
    return not connection.in_atomic_block and not connection.get_autocommit()


def _map_state(connection: BaseDatabaseWrapper, code: str) -> MapState:
    """What this call may rely on about ``code``'s map.

    The shared cache only ever holds committed rows. Outside a transaction, and inside
    one that has not written to this map, a load sees committed rows only, so it is
    shared (and single-flight). A transaction with its own uncommitted writes to the map
    gets a private view: the shared state (or a private load) plus those writes.
    """
    alias = connection.alias
    key = (alias, code)
    if _in_manual_transaction(connection):
        # Its own uncommitted writes are in what it loads, and on_commit cannot say
        # whether they will be committed: a private view, never shared.
        return _load(alias, code)
    if not connection.in_atomic_block:
        return token_cache.get(key, lambda: _load(alias, code))
    pending = _pending_publications(connection, key)
    if not pending:
        return token_cache.get(key, lambda: _load(alias, code))
    shared = token_cache.peek(key)
    view = shared.copy() if shared is not None else _load(alias, code)
    for publication in pending:
        publication.apply_to(view)
    return view


class _Writer:
    """The writes of one call on one code's map.

    ``self.state`` is what the call started from; everything learned or written is
    published (see :class:`_Publication`), never written into a shared state directly
    (only the ``contended_until`` hint is).
    A state's ``sequence`` is a number up to which it knows every token: loads, catch-ups
    and won compare-and-sets all keep that true, which is what makes a cache miss almost
    always a new value.
    """

    def __init__(self, connection: BaseDatabaseWrapper, code: str, state: MapState) -> None:
        self.connection = connection
        self.alias = connection.alias
        self.code = code
        self.state = state
        # Rows found by catch-ups during this call, by lookup key.
        self.learned: dict[str, TokenRow] = {}
        # Whether the last claim failed on its insert (not on the compare-and-set).
        self.insert_failed = False

    def publish(
        self,
        *,
        rows: tuple[TokenRow, ...] = (),
        map_id: int | None = None,
        sequence: int | None = None,
        spelling: tuple[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        key = (self.alias, self.code)
        publication = _Publication(
            key, rows=rows, map_id=map_id, sequence=sequence, spelling=spelling, token=token
        )
        if self.connection.in_atomic_block:
            self.connection.on_commit(publication)
        elif _in_manual_transaction(self.connection):
            # A rollback would leave the cache with rows no one else has: another process
            # could give their token to another value. Not published; the cache reads
            # what was committed at its next load.
            return
        else:
            publication()  # autocommit: the write is already committed

    def forget(self) -> None:
        """The map was deleted under us (by an operator): drop what the cache knows."""
        token_cache.invalidate((self.alias, self.code))

    def catch_up(self, map_id: int, known: int) -> int | None:
        """One query: the map's sequence and every token numbered above ``known``.

        Publishes what it finds and returns the sequence, or None if the map is gone.
        """
        newer = FilteredRelation("tokens", condition=Q(tokens__number__gt=known))
        found = (
            TokenMap.objects.using(self.alias)
            .annotate(newer=newer)
            .filter(pk=map_id)
            .values_list(
                "sequence", "newer__pk", "newer__token", "newer__lookup_key", "newer__encrypted_surface"
            )
        )
        sequence: int | None = None
        rows: list[TokenRow] = []
        for map_sequence, pk, token, lookup_key, ciphertext in found:
            sequence = map_sequence
            if pk is not None:
                rows.append(TokenRow(pk, token, lookup_key, ciphertext))
        if sequence is None:
            return None
        self.publish(rows=tuple(rows), map_id=map_id, sequence=sequence)
        for row in rows:
            self.learned[row.lookup_key] = row
        return sequence

    def find(self, map_id: int, lookup_key: str) -> TokenRow | None:
        found = (
            PhiToken.objects.using(self.alias)
            .filter(token_map_id=map_id, lookup_key=lookup_key)
            .values_list("pk", "token", "encrypted_surface")
            .first()
        )
        if found is None:
            return None
        row = TokenRow(found[0], found[1], lookup_key, found[2])
        self.publish(rows=(row,))
        return row

    def claim(
        self, map_id: int, sequence: int, category: str, lookup_key: str, surface: str, ciphertext: str
    ) -> TokenRow | None:
        """Take number ``sequence + 1`` for the value; None if another writer got there first.

        The compare-and-set on the sequence and the insert share one transaction (a
        savepoint inside the caller's) — on PostgreSQL one statement — so losing on the
        insert gives the number back.
        """
        number = sequence + 1
        token = make_token(category, number)
        now = timezone.now()
        values = {
            "category": category,
            "number": number,
            "token": token,
            "lookup_key": lookup_key,
            "encrypted_surface": ciphertext,
        }
        try:
            if self.connection.vendor == "postgresql":
                pk = _claim_in_one_statement(self.connection, map_id, sequence, values, now)
                if pk is None:
                    return None
            else:
                with transaction.atomic(using=self.alias):
                    claimed = (
                        TokenMap.objects.using(self.alias)
                        .filter(pk=map_id, sequence=sequence)
                        .update(sequence=number, updated_at=now)
                    )
                    if not claimed:
                        return None
                    pk = (
                        PhiToken.objects.using(self.alias)
                        .create(token_map_id=map_id, created_at=now, updated_at=now, **values)
                        .pk
                    )
        except IntegrityError:
            # The value (or, on a map whose sequence was edited by hand, the number)
            # was taken; the rollback returned the number.
            self.insert_failed = True
            return None
        return TokenRow(pk, token, lookup_key, ciphertext, surface)

    def repair_sequence(self, map_id: int, sequence: int) -> None:
        """Move a sequence that fell behind its tokens (edited by hand) past them."""
        highest = PhiToken.objects.using(self.alias).filter(token_map_id=map_id).aggregate(Max("number"))
        top = highest["number__max"] or 0
        if top > sequence:
            TokenMap.objects.using(self.alias).filter(pk=map_id, sequence=sequence).update(
                sequence=top, updated_at=timezone.now()
            )
            logger.warning("token map #%s: sequence was behind its tokens; moved to %s", map_id, top)

    def allocate(self, category: str, lookup_key: str, surface: str, spelling: tuple[str, str]) -> str:
        # Long function: the allocation's retry loop around one statement.
        map_id, sequence = self.state.map_id, self.state.sequence
        ciphertext = keyring().encrypt(lookup_key, surface)
        # On a map other writers are allocating in right now, look (a plain read) before
        # claiming: the value is likely theirs already, and a claim would queue behind
        # their transactions only to lose.
        look_first = self.state.contended_until > time.monotonic()
        for _ in range(_ALLOCATION_ROUNDS):
            self.insert_failed = False
            if map_id is None:
                token_map, created = TokenMap.objects.using(self.alias).get_or_create(
                    code_hash=code_hash(self.code)
                )
                map_id, sequence = token_map.pk, 0
                if created:
                    self.publish(map_id=map_id, sequence=0)
                else:
                    caught_up = self.catch_up(map_id, 0)
                    if caught_up is None:
                        map_id = None
                        continue
                    sequence = caught_up
                    if lookup_key in self.learned:
                        return self.adopt(self.learned[lookup_key], surface, spelling, map_id)
            elif look_first:
                look_first = False
                caught_up = self.catch_up(map_id, sequence)
                if caught_up is None:
                    self.forget()
                    map_id, sequence = None, 0
                    continue
                if lookup_key in self.learned:
                    return self.adopt(self.learned[lookup_key], surface, spelling, map_id)
                sequence = caught_up
            row = self.claim(map_id, sequence, category, lookup_key, surface, ciphertext)
            if row is not None:
                self.publish(rows=(row,), map_id=map_id, sequence=sequence + 1, spelling=spelling)
                logger.debug("token map #%s: allocated %s", map_id, row.token)
                return row.token
            # Lost the race: learn what the other writers allocated, which may be this value.
            self.state.contended_until = time.monotonic() + _CONTENDED_FOR
            look_first = False
            caught_up = self.catch_up(map_id, sequence)
            if caught_up is None:
                logger.warning("token map #%s was deleted while a token was being allocated", map_id)
                self.forget()
                map_id, sequence = None, 0
                continue
            if lookup_key in self.learned:
                return self.adopt(self.learned[lookup_key], surface, spelling, map_id)
            if self.insert_failed and caught_up == sequence:
                # The insert failed but nothing new was allocated: the value is older
                # than this process knew, or the sequence is behind its tokens.
                existing = self.find(map_id, lookup_key)
                if existing is not None:
                    return self.adopt(existing, surface, spelling, map_id)
                self.repair_sequence(map_id, sequence)
                caught_up = self.catch_up(map_id, sequence) or sequence
            sequence = caught_up
        raise TokenAllocationError(
            f"could not allocate a {category} token in token map #{map_id} after {_ALLOCATION_ROUNDS} "
            "rounds: concurrent writers kept taking the next sequence number"
        )

    def adopt(self, row: TokenRow, surface: str, spelling: tuple[str, str], map_id: int | None) -> str:
        """Another writer allocated this value: use its token, upgrade its surface if ours is richer."""
        self.publish(spelling=spelling, token=row.token)
        self.upgrade(row, surface, map_id)
        return row.token

    def upgrade(self, row: TokenRow, candidate: str, map_id: int | None) -> None:
        """Replace the stored surface by ``candidate`` if it is richer (compare-and-set)."""
        if not is_richer(candidate, row.surface()):
            return
        alias = self.alias
        ciphertext = keyring().encrypt(row.lookup_key, candidate)
        for _ in range(_UPGRADE_ROUNDS):
            replaced = (
                PhiToken.objects.using(alias)
                .filter(pk=row.pk, encrypted_surface=row.ciphertext)
                .update(encrypted_surface=ciphertext, updated_at=timezone.now())
            )
            if replaced:
                self.publish(rows=(TokenRow(row.pk, row.token, row.lookup_key, ciphertext, candidate),))
                logger.debug("token map #%s: surface of %s upgraded", map_id, row.token)
                return
            # Someone else stored a surface (or rotated the key) since we read it.
            ciphertext_now = (
                PhiToken.objects.using(alias)
                .filter(pk=row.pk)
                .values_list("encrypted_surface", flat=True)
                .first()
            )
            if ciphertext_now is None:
                self.forget()
                return
            row = TokenRow(row.pk, row.token, row.lookup_key, ciphertext_now)
            if not is_richer(candidate, row.surface()):
                self.publish(rows=(row,))
                return
        logger.warning(
            "token map #%s: gave up upgrading the surface of %s after %d rounds",
            map_id,
            row.token,
            _UPGRADE_ROUNDS,
        )


def _claim_in_one_statement(
    connection: BaseDatabaseWrapper, map_id: int, sequence: int, values: dict[str, Any], now: Any
) -> int | None:
    """PostgreSQL: the compare-and-set on the sequence and the insert as ONE statement
    (a data-modifying CTE), so an allocation costs one round trip and one commit instead of
    four round trips. Returns the new row's id, or None when the sequence had moved; a
    taken value raises ``IntegrityError`` and undoes the whole statement. Inside the
    caller's transaction it runs in a savepoint, as the ORM path does."""
    sql = postgresql.allocate_token_sql(connection, TokenMap._meta, PhiToken._meta, list(values))
    params = [values["number"], now, map_id, sequence, *values.values(), now, now]
    in_transaction = connection.in_atomic_block or not connection.get_autocommit()
    savepoint = transaction.atomic(using=connection.alias) if in_transaction else nullcontext()
    with savepoint, connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


def _encode_checked(
    connection: BaseDatabaseWrapper, code: str, category: str, text: str, normalized: str | None
) -> str:
    """Encode a validated value; ``normalized`` may be passed when already computed."""
    state = _map_state(connection, code)
    spelling = (category, text)
    token = state.spellings.get(spelling)
    if token is not None:
        return token
    if normalized is None:
        normalized = normalize_text(text, category)
    surface = surface_form(text)
    lookup_key = keyring().lookup_key(code, category, normalized)
    writer = _Writer(connection, code, state)
    token = state.by_lookup.get(lookup_key)
    if token is None:
        return writer.allocate(category, lookup_key, surface, spelling)
    row = state.rows[token]
    writer.upgrade(row, surface, state.map_id)
    writer.publish(spelling=spelling, token=token)
    return token


# sensitive_variables on the entry points: an error report (Django's, DEBUG off) of a
# failure in them or below shows no frame's variables (codes, values, texts, surfaces, SQL
# parameters): a database error in a request must not mail a patient's message.
@sensitive_variables()
def encode(code: str, value: Any, category: str) -> str:
    """The token of ``value`` in conversation ``code``, e.g. ``"<<PERSONA_1>>"``.

    The same value (after normalisation) always gets the same token, from any process;
    a new value gets ``<<CATEGORY_N>>`` with ``N`` from the code's one sequence. Numbers
    are accepted as their text. A richer spelling of a known value replaces its stored
    surface.
    """
    code = check_code(code)
    category = check_category(category)
    text = value_text(value, category)
    return _encode_checked(_connection(), code, category, text, None)


@sensitive_variables()
def decode(code: str, text: str) -> str:
    """``text`` with every token of ``code`` replaced by its stored surface.

    Tokens the code does not know are left as they are. Raises
    ``SurfaceDecryptionError`` if a surface cannot be decrypted.
    """
    code = check_code(code)
    if not isinstance(text, str):
        raise InvalidText(f"decode needs the text as a string; got {type(text).__name__}")
    if "<<" not in text:
        return text
    found = set(TOKEN_PATTERN.findall(text))
    if not found:
        return text
    connection = _connection()
    state = _map_state(connection, code)
    rows = state.rows
    missing = [token for token in found if token not in rows]
    if missing:
        # Tokens allocated by other processes since this map was cached.
        fresh = [
            TokenRow(pk, token, lookup_key, ciphertext)
            for pk, token, lookup_key, ciphertext in PhiToken.objects.using(connection.alias)
            .filter(token_map__code_hash=code_hash(code), token__in=missing)
            .values_list("pk", "token", "lookup_key", "encrypted_surface")
        ]
        if fresh:
            rows = {**rows, **{row.token: row for row in fresh}}
            _Writer(connection, code, state).publish(rows=tuple(fresh))

    def replace(match: re.Match[str]) -> str:
        row = rows.get(match.group(0))
        return match.group(0) if row is None else row.surface()

    return TOKEN_PATTERN.sub(replace, text)


Span = tuple[int, int, str]


def _caller_spans(text: str, spans: Iterable[Any] | None) -> list[Span]:
    if spans is not None and (isinstance(spans, bool) or not isinstance(spans, Iterable)):
        raise InvalidSpan(
            f"spans must be a list of (start, end, category) tuples; got {type(spans).__name__}"
        )
    checked: list[Span] = []
    for index, span in enumerate(spans or ()):
        try:
            start, end, category = span
        except (TypeError, ValueError):
            raise InvalidSpan(f"span {index} must be a (start, end, category) tuple") from None
        if any(isinstance(bound, bool) or not isinstance(bound, int) for bound in (start, end)):
            raise InvalidSpan(f"span {index}: start and end must be whole numbers")
        if not 0 <= start < end <= len(text):
            # Not the bounds themselves: an int of thousands of digits cannot even be written.
            raise InvalidSpan(
                f"span {index} must satisfy 0 <= start < end <= {len(text)} (the length of the text)"
            )
        checked.append((start, end, check_category(category)))
    checked.sort()
    for before, after in itertools.pairwise(checked):
        if after[0] < before[1]:
            raise InvalidSpan(f"spans ({before[0]}, {before[1]}) and ({after[0]}, {after[1]}) overlap")
    return checked


@sensitive_variables()
def find_spans(text: str, spans: Iterable[Any] | None = ()) -> list[Span]:
    """The caller's spans plus the phones, e-mail addresses and IDs found in ``text``.

    Detection is :mod:`.recognizers`; a found span that overlaps a caller's span is dropped
    (the caller's recogniser wins), and overlapping found spans are resolved there.
    """
    if not isinstance(text, str):
        raise InvalidText(f"find_spans needs the text as a string; got {type(text).__name__}")
    caller = _caller_spans(text, spans)
    return resolve(caller, recognize(text, app_settings.PHI_DEFAULT_REGION))


@sensitive_variables()
def encode_text(code: str, text: str, spans: Iterable[Any] | None = ()) -> str:
    """``text`` with its PHI replaced by tokens of conversation ``code``.

    Phone numbers, e-mail addresses and Mexican IDs (CURP, RFC, INE voter key, NSS) are found here (see
    :mod:`.recognizers`; phones without a country code are read in ``PHI_DEFAULT_REGION``);
    names and anything else come as ``(start, end, category)`` spans from the caller's
    recogniser.
    Every span is validated and normalised before the first token is written.
    """
    code = check_code(code)
    if not isinstance(text, str):
        raise InvalidText(f"encode_text needs the text as a string; got {type(text).__name__}")
    prepared: list[tuple[int, int, str, str, str]] = []
    for start, end, category in find_spans(text, spans):
        value = text[start:end]
        try:
            normalized = normalize_text(value_text(value, category), category)
        except InvalidPhiValue as error:
            raise InvalidPhiValue(f"span ({start}, {end}): {error}") from None
        prepared.append((start, end, category, value, normalized))
    if not prepared:
        return text
    connection = _connection()
    pieces: list[str] = []
    position = 0
    for start, end, category, value, normalized in prepared:
        pieces.append(text[position:start])
        pieces.append(_encode_checked(connection, code, category, value, normalized))
        position = end
    pieces.append(text[position:])
    return "".join(pieces)
