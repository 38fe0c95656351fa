"""Voices moving in and out of the library: the export document (exact round trip, a property
over embeddings, codes and metadata, on both back ends), its validation, the one-time import of a
legacy ``--voices-dir`` (the files gateways wrote before the library, with and without model
families and designs), and the checks of every field."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.voice_library import (
    DOCUMENT_FORMAT,
    NewVoice,
    RefCodes,
    Scope,
    VoicePatch,
    create_voice_library,
    parse_document,
)
from gateway.voice_library.postgres import redact
from gateway.voice_library.records import check_new_voice, datetime_from_us, us_from_datetime
from gateway.voice_library.sqlite import SqliteVoiceLibrary
from tests.helpers.fake_stages import run
from tests.helpers.voices import write_legacy_voice
from tts_common.errors import InvalidRequestError, NotFoundError

from .conftest import Backend
from .test_library import ADMIN, ALICE, BOB, make_voice

finite_float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=40)


@st.composite
def new_voices(draw: st.DrawFn) -> NewVoice:
    x_vector_only = draw(st.booleans())
    codes = None
    if not x_vector_only:
        frames, books = draw(st.integers(0, 6)), draw(st.integers(1, 16))
        values = draw(
            st.lists(st.integers(-(2**31), 2**31 - 1), min_size=frames * books, max_size=frames * books)
        )
        codes = RefCodes.from_flat(np.asarray(values, dtype=np.int64), frames, books)
    return NewVoice(
        speaker_embedding=np.asarray(
            draw(st.lists(finite_float32, min_size=1, max_size=64)), dtype=np.float32
        ),
        ref_codes=codes,
        x_vector_only=x_vector_only,
        ref_text=draw(text),
        name=draw(text),
        description=draw(text),
        labels=draw(
            st.dictionaries(st.from_regex(r"[A-Za-z0-9_.:-]{1,12}", fullmatch=True), text, max_size=4)
        ),
        model_family=draw(text),
        model_name=draw(text),
        consent=draw(text),
        ref_audio_seconds=draw(st.floats(0, 1e6, allow_nan=False)),
        audio_sha256=draw(st.sampled_from(["", "0f" * 32])),
        design=draw(
            st.none()
            | st.fixed_dictionaries(
                {"instruct": text, "seed": st.integers(0, 2**64 - 1)}, optional={"language": text}
            )
        ),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(voice=new_voices())
def test_export_then_import_is_exact(backend: Backend, voice: NewVoice) -> None:
    async def main() -> None:
        async with backend.library() as library:
            stored = await library.add(voice, ALICE)
            document = json.loads(json.dumps(await library.export(stored.voice_id, ALICE)))  # through text
            assert document["format"] == DOCUMENT_FORMAT and "owner" not in document["voice"]
            await library.delete(stored.voice_id, ALICE)
            imported = await library.import_document(document, BOB)
            assert imported.voice_id == stored.voice_id  # free again: the id is kept
            assert imported.speaker_embedding.tobytes() == stored.speaker_embedding.tobytes()
            assert imported.ref_codes == stored.ref_codes
            assert imported.info.owner == BOB.owner
            same = ("name", "description", "labels", "model_family", "model_name", "consent", "x_vector_only")
            same += ("ref_text", "ref_audio_seconds", "audio_sha256", "created_at", "design")
            for name in same:
                assert getattr(imported.info, name) == getattr(stored.info, name), name
            assert await library.get(imported.voice_id, BOB) == imported
            await library.delete(imported.voice_id, BOB)

    run(main())


def test_import_takes_a_new_id_when_taken_and_validates(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library() as library:
            stored = await library.add(make_voice(1), ALICE)
            document = await library.export(stored.voice_id, ALICE)
            copy = await library.import_document(document, BOB)
            assert copy.voice_id != stored.voice_id and copy.info.owner == BOB.owner
            assert copy.speaker_embedding.tobytes() == stored.speaker_embedding.tobytes()
            broken = [
                {**document, "format": "something-else"},
                {**document, "format_version": 2},
                {**document, "voice": {**document["voice"], "speaker_embedding": []}},
                {**document, "voice": {**document["voice"], "speaker_embedding": ["1.0"]}},
                {**document, "voice": {**document["voice"], "x_vector_only": "no"}},
                {
                    **document,
                    "voice": {
                        **document["voice"],
                        "ref_codes": {**document["voice"]["ref_codes"], "num_frames": 5},
                    },
                },
                {**document, "voice": {**document["voice"], "x_vector_only": True}},
                {**document, "voice": {**document["voice"], "created_at": "yesterday"}},
                {**document, "voice": {**document["voice"], "labels": {"k": 3}}},
                {**document, "voice": {**document["voice"], "design": "designed"}},
                [document],
            ]
            for bad in broken:
                with pytest.raises(InvalidRequestError):
                    await library.import_document(bad, BOB)
            assert await library.count(ADMIN) == 2

    run(main())


def test_legacy_directory_is_imported_once(backend: Backend, tmp_path: Path) -> None:
    legacy = tmp_path / "voices"
    legacy.mkdir()
    design = {"instruct": "A warm voice.", "text": "legacy words", "seed": "7", "model": "design"}
    written = [
        write_legacy_voice(legacy, 1),  # before model families: no "family"
        write_legacy_voice(legacy, 2, x_vector_only=True, family="1b7"),
        write_legacy_voice(legacy, 3, family="0b6", design=design),
    ]
    (legacy / "voice-broken.json").write_text("{not json")
    (legacy / f"voice-{9:032x}.json").write_text(json.dumps({**written[0], "voice_id": f"voice-{8:032x}"}))

    async def main() -> None:
        async with backend.library() as one, backend.library() as two:
            reports = await asyncio.gather(
                one.import_legacy_directory(legacy, model_family="0.6B/12hz"),
                two.import_legacy_directory(legacy, model_family="0.6B/12hz"),
            )
            first = next(r for r in reports if not r.already_done)
            assert (first.imported, first.already_present) == (3, 0)
            assert first.skipped_files == (f"voice-{9:032x}.json", "voice-broken.json")
            assert sum(r.already_done for r in reports) == 1  # the other one found it done
            again = await one.import_legacy_directory(legacy)
            assert again.already_done and again.imported == 0
            forced = await one.import_legacy_directory(legacy, again=True)
            assert (forced.imported, forced.already_present, forced.already_done) == (0, 3, False)
            for old, family in zip(written, ("0.6B/12hz", "1b7", "0b6")):
                record = await two.get(old["voice_id"], Scope())  # the anonymous owner (keys off)
                assert record.speaker_embedding.tolist() == old["speaker_embedding"]
                assert (
                    record.speaker_embedding.tobytes()
                    == np.asarray(old["speaker_embedding"], np.float32).tobytes()
                )
                if old["ref_codes"] is None:
                    assert record.ref_codes is None and record.info.x_vector_only
                else:
                    assert record.ref_codes.flat() == old["ref_codes"]["values"]  # type: ignore[union-attr]
                info = record.info
                assert (info.name, info.ref_text, info.model_name) == (
                    old["name"],
                    old["ref_text"],
                    old["model_name"],
                )
                # the file's family is kept; the importer's only fills in a missing one
                assert (info.ref_audio_seconds, info.audio_sha256, info.model_family) == (
                    2.5,
                    "ab" * 32,
                    family,
                )
                assert info.design == old.get("design")
                created = Timestamp()
                created.FromJsonString(old["created_at"])
                assert us_from_datetime(info.created_at) == created.ToMicroseconds()
            with pytest.raises(NotFoundError):  # keyed callers do not see the anonymous voices
                await one.get(written[0]["voice_id"], ALICE)
            trail = await one.audit_trail(ADMIN)
            assert sorted(e.voice_id for e in trail if e.action == "legacy_import") == sorted(
                w["voice_id"] for w in written
            )
            missing = await one.import_legacy_directory(tmp_path / "nowhere")
            assert (missing.imported, missing.skipped_files) == (0, ())

    run(main())


def test_every_field_is_checked() -> None:
    good = make_voice(1)
    bad_voices = [
        NewVoice(speaker_embedding=[], ref_codes=None, x_vector_only=True),
        NewVoice(speaker_embedding=[float("nan")], ref_codes=None, x_vector_only=True),
        NewVoice(speaker_embedding=np.zeros((2, 2)), ref_codes=None, x_vector_only=True),
        NewVoice(speaker_embedding=["x"], ref_codes=None, x_vector_only=True),
        NewVoice(speaker_embedding=[1.0], ref_codes=None, x_vector_only=False),
        NewVoice(speaker_embedding=[1.0], ref_codes=good.ref_codes, x_vector_only=True),
        NewVoice(speaker_embedding=[1.0], ref_codes=None, x_vector_only=True, name="n" * 201),
        NewVoice(speaker_embedding=[1.0], ref_codes=None, x_vector_only=True, name="nul\x00"),
        NewVoice(
            speaker_embedding=[1.0],
            ref_codes=None,
            x_vector_only=True,
            labels={str(i): "" for i in range(33)},
        ),
        NewVoice(speaker_embedding=[1.0], ref_codes=None, x_vector_only=True, audio_sha256="ABC"),
        NewVoice(speaker_embedding=[1.0], ref_codes=None, x_vector_only=True, ref_audio_seconds=-1.0),
        NewVoice(speaker_embedding=[1.0], ref_codes=None, x_vector_only=True, voice_id="voice-1"),
    ]
    for bad in bad_voices:
        with pytest.raises(InvalidRequestError):
            check_new_voice(bad)
    with pytest.raises(InvalidRequestError):
        RefCodes.from_flat([1, 2, 3], 2, 2)
    with pytest.raises(InvalidRequestError):
        RefCodes.from_flat([2**31], 1, 1)
    assert check_new_voice(good).speaker_embedding.dtype == np.float32
    moment = datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=timezone.utc)
    assert datetime_from_us(us_from_datetime(moment)) == moment
    assert VoicePatch(name="a", labels={}).changed_fields() == ["name", "labels"]
    with pytest.raises(InvalidRequestError):
        parse_document({"format": DOCUMENT_FORMAT, "format_version": 1, "voice": {"x_vector_only": True}})


def test_database_locations(tmp_path: Path) -> None:
    library = create_voice_library(tmp_path / "a.db")
    assert isinstance(library, SqliteVoiceLibrary) and library.path == tmp_path / "a.db"
    assert create_voice_library(f"sqlite:///{tmp_path}/b.db").path == tmp_path / "b.db"  # type: ignore[attr-defined]
    assert create_voice_library("sqlite:///voices.db").path == Path("voices.db")  # type: ignore[attr-defined]
    assert (
        create_voice_library("postgresql://u:secret@db:5432/x").location
        == "postgresql://u:***@db:5432/x (schema public)"
    )
    assert create_voice_library("postgres://db/x").dialect == "postgresql"
    for bad in ("mysql://db/x", "sqlite://", ":memory:", ""):
        with pytest.raises(ValueError):
            create_voice_library(bad)
    assert redact("postgresql://db/x") == "postgresql://db/x"
