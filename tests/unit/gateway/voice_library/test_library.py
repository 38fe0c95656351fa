"""The voice library's operations on both back ends (the ``backend`` fixture): what replicas over
one database see of each other, ownership, quotas, PATCH, audit trail and schema start-up."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import numpy as np
import pytest

from gateway.voice_library import (
    LATEST_VERSION,
    NewVoice,
    OwnerDigest,
    RefCodes,
    Scope,
    VoiceLibrary,
    VoicePatch,
    VoiceRecord,
)
from tests.helpers.fake_stages import run
from tts_common.errors import AlreadyExistsError, CapacityError, InvalidRequestError, NotFoundError

from .conftest import Backend

ALICE = Scope(owner="a" * 64)
BOB = Scope(owner="b" * 64)
ADMIN = Scope(owner="c" * 64, admin=True)


def make_voice(seed: int = 0, *, x_vector_only: bool = False, **fields: object) -> NewVoice:
    rng = np.random.default_rng(seed)
    codes = None if x_vector_only else RefCodes.from_flat(rng.integers(0, 2048, 4 * 16), 4, 16)
    return NewVoice(
        speaker_embedding=rng.standard_normal(32).astype(np.float32),
        ref_codes=codes,
        x_vector_only=x_vector_only,
        ref_text="" if x_vector_only else f"reference words {seed}",
        **{"name": f"voice {seed}", **fields},  # type: ignore[arg-type]
    )


async def ids(library: VoiceLibrary, scope: Scope, **filters: object) -> list[str]:
    return [info.voice_id async for info in library.iter_voices(scope, **filters)]  # type: ignore[arg-type]


def test_add_get_list_round_trip_exactly(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as library:
            voice = make_voice(1, labels={"accent": "scottish"}, description="warm", consent="consent-42")
            added = await library.add(voice, ALICE)
            assert added.info.owner == ALICE.owner and added.voice_id.startswith("voice-")
            assert added.info.created_at == added.info.updated_at
            got = await library.get(added.voice_id, ALICE)
            assert got == added
            assert got.speaker_embedding.tobytes() == np.asarray(voice.speaker_embedding).tobytes()
            assert got.ref_codes == voice.ref_codes and got.info.labels == {"accent": "scottish"}
            assert (got.info.consent, got.info.description, got.info.ref_text) == (
                "consent-42",
                "warm",
                "reference words 1",
            )
            xvec = await library.add(make_voice(2, x_vector_only=True), ALICE)
            assert (await library.get(xvec.voice_id, ALICE)).ref_codes is None
            page = await library.list_voices(ALICE)
            assert [v.voice_id for v in page.voices] == [added.voice_id, xvec.voice_id]
            assert page.voices[0] == added.info and page.next_page_token == ""
            assert await library.count(ALICE) == 2

    run(main())


def test_replicas_see_each_others_adds_and_deletes_at_once(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as one, backend.library() as two:
            added = await one.add(make_voice(1), ALICE)
            assert await two.get(added.voice_id, ALICE) == added  # no restart, no wait
            assert await ids(two, ALICE) == [added.voice_id]
            await two.delete(added.voice_id, ALICE)
            with pytest.raises(NotFoundError):
                await one.get(added.voice_id, ALICE)
            assert await ids(one, ALICE) == []
            renamed = await one.add(make_voice(2), ALICE)
            await two.update(renamed.voice_id, VoicePatch(name="renamed"), ALICE)
            assert (await one.get(renamed.voice_id, ALICE)).info.name == "renamed"

    run(main())


def test_fifty_concurrent_registrations_through_two_replicas(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as one, backend.library() as two:
            added = await asyncio.gather(
                *((one if i % 2 else two).add(make_voice(i), ALICE) for i in range(50))
            )
            assert len({r.voice_id for r in added}) == 50
            # listed by both, page by page (7 at a time), oldest first, each once
            for library in (one, two):
                listed: list[str] = []
                token = ""
                while True:
                    page = await library.list_voices(ALICE, page_size=7, page_token=token)
                    listed += [v.voice_id for v in page.voices]
                    token = page.next_page_token
                    if not token:
                        break
                assert sorted(listed) == sorted(r.voice_id for r in added) and len(listed) == 50
                assert listed == [
                    r.voice_id for r in sorted(added, key=lambda r: (r.info.created_at, r.voice_id))
                ]
            assert await two.count(ALICE) == 50

    run(main(), timeout=60)


def test_another_owners_voice_is_not_found_and_unlisted(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as library:
            digest = await library.owner_digest()
            alice, bob = digest.scope_of("key-A"), digest.scope_of("key-B")
            assert alice.owner != bob.owner and "key-A" not in alice.owner
            voice = await library.add(make_voice(1), alice)
            for attempt in (
                library.get(voice.voice_id, bob),
                library.delete(voice.voice_id, bob),
                library.update(voice.voice_id, VoicePatch(name="mine"), bob),
                library.export(voice.voice_id, bob),
            ):
                with pytest.raises(NotFoundError) as caught:
                    await attempt
                assert str(caught.value) == f"unknown voice_id {voice.voice_id!r} (see ListVoices)"
            with pytest.raises(NotFoundError) as unknown:  # same answer as an id nobody has
                await library.get("voice-" + "0" * 32, bob)
            assert "unknown voice_id" in str(unknown.value)
            assert await ids(library, bob) == [] and await library.count(bob) == 0
            assert await ids(library, alice) == [voice.voice_id]
            # the admin sees and manages every owner's voices
            bobs = await library.add(make_voice(2), bob)
            assert sorted(await ids(library, ADMIN)) == sorted([voice.voice_id, bobs.voice_id])
            assert await ids(library, ADMIN, owner=bob.owner) == [bobs.voice_id]  # type: ignore[arg-type]
            assert (await library.get(voice.voice_id, ADMIN)) == voice
            await library.delete(voice.voice_id, ADMIN)
            with pytest.raises(NotFoundError):
                await library.get(voice.voice_id, alice)
            # without API keys every caller is the anonymous owner
            anonymous = digest.scope_of(None)
            assert anonymous == Scope() and await ids(library, anonymous) == []

    run(main())


def test_global_limit_and_per_owner_quota_hold_across_replicas(backend: Backend) -> None:
    async def main() -> None:
        settings = {"max_voices": 6, "max_voices_per_owner": 4}
        async with backend.library(**settings) as one, backend.library(**settings) as two:
            results = await asyncio.gather(
                *((one if i % 2 else two).add(make_voice(i), ALICE) for i in range(7)), return_exceptions=True
            )
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(refused) == 3 and all(isinstance(r, CapacityError) for r in refused)
            assert "voice quota reached (4 voices for this API key)" in str(refused[0])
            assert await one.count(ALICE) == 4
            await one.add(make_voice(10), BOB)
            await two.add(make_voice(11), BOB)
            with pytest.raises(CapacityError, match=r"voice limit reached \(6 registered voices\)"):
                await one.add(make_voice(12), Scope(owner="d" * 64))
            # deleting frees a place
            (first, *_) = (await one.list_voices(ALICE)).voices
            await two.delete(first.voice_id, ALICE)
            await one.add(make_voice(13), Scope(owner="d" * 64))

    run(main())


def test_patch_changes_only_what_it_names(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as library:
            voice = await library.add(make_voice(1, description="first", labels={"a": "1"}), ALICE)
            renamed = await library.update(voice.voice_id, VoicePatch(name="new name"), ALICE)
            assert (renamed.name, renamed.description, dict(renamed.labels)) == (
                "new name",
                "first",
                {"a": "1"},
            )
            assert renamed.created_at == voice.info.created_at and renamed.updated_at > voice.info.updated_at
            relabelled = await library.update(
                voice.voice_id, VoicePatch(labels={"b": "2"}, description=""), ALICE
            )
            assert (relabelled.name, relabelled.description, dict(relabelled.labels)) == (
                "new name",
                "",
                {"b": "2"},
            )
            unchanged = await library.update(voice.voice_id, VoicePatch(), ALICE)
            assert unchanged == relabelled
            stored = await library.get(voice.voice_id, ALICE)
            assert (
                stored.info == relabelled
                and stored.speaker_embedding.tobytes() == voice.speaker_embedding.tobytes()
            )
            for bad in (
                VoicePatch(name="x" * 201),
                VoicePatch(labels={"bad key": "v"}),
                VoicePatch(labels={"k": 1}),
            ):  # type: ignore[dict-item]
                with pytest.raises(InvalidRequestError):
                    await library.update(voice.voice_id, bad, ALICE)
            with pytest.raises(NotFoundError):
                await library.update("voice-" + "1" * 32, VoicePatch(name="x"), ALICE)

    run(main())


def test_model_family_filter_and_explicit_ids(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as library:
            small = await library.add(make_voice(1, model_family="0.6B/12hz"), ALICE)
            large = await library.add(make_voice(2, model_family="1.7B/12hz"), ALICE)
            assert await ids(library, ALICE, model_family="1.7B/12hz") == [large.voice_id]
            assert await library.count(ALICE, model_family="0.6B/12hz") == 1
            chosen = "voice-" + "ab" * 16
            await library.add(make_voice(3, voice_id=chosen), ALICE)
            with pytest.raises(AlreadyExistsError):
                await library.add(make_voice(4, voice_id=chosen), BOB)
            with pytest.raises(InvalidRequestError):
                await library.list_voices(ALICE, page_token="not-a-token")
            assert small.info.model_family == "0.6B/12hz"

    run(main())


def test_audit_trail_records_who_did_what_and_is_append_only(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as library:
            voice = await library.add(make_voice(1), ALICE)
            await library.update(voice.voice_id, VoicePatch(name="renamed"), ALICE)
            await library.export(voice.voice_id, ALICE)
            imported = await library.import_document(await library.export(voice.voice_id, ADMIN), BOB)
            await library.delete(voice.voice_id, ADMIN)
            trail = await library.audit_trail(ADMIN)
            assert [(e.action, e.voice_id, e.actor, e.admin) for e in trail] == [
                ("register", voice.voice_id, ALICE.owner, False),
                ("update", voice.voice_id, ALICE.owner, False),
                ("export", voice.voice_id, ALICE.owner, False),
                ("export", voice.voice_id, ADMIN.owner, True),
                ("import", imported.voice_id, BOB.owner, False),
                ("delete", voice.voice_id, ADMIN.owner, True),
            ]
            assert trail[1].detail == {"changed": ["name"], "name": "renamed"}
            assert [e.seq for e in trail] == sorted({e.seq for e in trail})
            assert [e.action for e in await library.audit_trail(ALICE)] == ["register", "update", "export"]
            assert [e.action for e in await library.audit_trail(ADMIN, voice_id=imported.voice_id)] == [
                "import"
            ]
            assert len(await library.audit_trail(ADMIN, after_seq=trail[3].seq)) == 2
            # no biometric data in the trail
            assert "speaker_embedding" not in json.dumps([dict(e.detail) for e in trail])
        await assert_audit_is_append_only(backend)

    run(main())


async def assert_audit_is_append_only(backend: Backend) -> None:
    """UPDATE and DELETE of the trail fail in the database itself (triggers)."""
    import asyncpg

    for statement in ("UPDATE voice_audit SET actor = 'x'", "DELETE FROM voice_audit"):
        with pytest.raises((sqlite3.IntegrityError, asyncpg.RaiseError), match="append-only"):
            await backend.raw(statement)
    assert len(await backend.raw("SELECT seq FROM voice_audit")) == 6


def test_concurrent_startups_apply_the_schema_once(backend: Backend) -> None:
    async def main() -> None:
        libraries = [backend.library() for _ in range(4)]
        try:
            await asyncio.gather(*(library.start() for library in libraries))
            assert {await library.schema_version() for library in libraries} == {LATEST_VERSION}
            digests = {(await library.owner_digest()).owner_of("key") for library in libraries}
            assert len(digests) == 1  # one generated secret, shared through the database
            voice = await libraries[0].add(make_voice(1), ALICE)
            await libraries[3].start()  # starting again changes nothing
            assert await libraries[3].get(voice.voice_id, ALICE) == voice
        finally:
            for library in libraries:
                await library.close()
        async with backend.library(owner_secret=b"s" * 32) as configured:
            assert (await configured.owner_digest()).owner_of("key") == OwnerDigest(b"s" * 32).owner_of("key")
        await assert_one_row_per_migration(backend)

    run(main())


async def assert_one_row_per_migration(backend: Backend) -> None:
    rows = await backend.raw("SELECT version FROM schema_migrations ORDER BY version")
    assert [row[0] for row in rows] == list(range(1, LATEST_VERSION + 1))


def test_a_record_is_equal_only_bit_for_bit() -> None:
    voice = make_voice(1)
    info_record = VoiceRecord(info=None, speaker_embedding=np.zeros(2, np.float32), ref_codes=None)  # type: ignore[arg-type]
    assert info_record != VoiceRecord(info=None, speaker_embedding=-np.zeros(2, np.float32), ref_codes=None)  # type: ignore[arg-type]
    assert info_record == VoiceRecord(info=None, speaker_embedding=np.zeros(2, np.float32), ref_codes=None)  # type: ignore[arg-type]
    assert voice.ref_codes == RefCodes.from_flat(voice.ref_codes.flat(), 4, 16)  # type: ignore[union-attr]
