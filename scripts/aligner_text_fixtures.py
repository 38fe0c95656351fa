"""Reference fixtures for the aligner's text rules, produced by the OFFICIAL code (qwen-asr 0.0.6's
``Qwen3ForceAlignProcessor``: word split per language, ``fix_timestamp``), and an oracle the tests
can query live.

Run it with the Python of a virtual environment holding the official package (``ORACLE_VENV``:
``pip install torch==2.13.0 qwen-asr==0.0.6``; set ``QWEN3TTS_ALIGNER_ORACLE_PYTHON`` to its Python
for the live-oracle tests):

    $ORACLE_VENV/bin/python scripts/aligner_text_fixtures.py            # write fixtures
    $ORACLE_VENV/bin/python scripts/aligner_text_fixtures.py --serve    # JSON lines oracle

It writes ``tests/fixtures/aligner/text_cases.json`` (texts, languages, official words) and
``repair_cases.json`` (raw millisecond values, official repaired values). Cases are hand-picked
(English, Chinese, Japanese, Korean, German, French, punctuation and numbers) plus seeded random
ones drawn from per-language character pools, so regenerating gives the same file.

``--serve`` reads one JSON object per line on stdin and answers one per line on stdout:
``{"words": TEXT, "language": LANG}`` -> ``{"words": [...]}``; ``{"repair": [ms, ...]}`` ->
``{"repaired": [...]}`` (tests/unit/aligner run hypothesis against it when the environment exists).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "aligner"

HAND_PICKED: list[tuple[str, str]] = [
    ("english", "Hello, world! It's a 3.5-hour trip -- isn't it?"),
    ("english", "The U.S.A. spent $1,234.56 on 'quoted' words... (and e-mail)."),
    ("english", "   leading and trailing   spaces\tand\ttabs\nand newlines  "),
    ("english", "!!! ... ---"),
    ("english", "'"),
    ("english", ""),
    ("english", "Mixed 中文 and English 混合text测试 here"),
    ("auto", "caf\u00e9 na\u0131\u0308ve co\u00f6perate \u00bd \u2460 x\u00b2"),
    ("chinese", "今天天气很好，我们去公园散步吧。"),
    ("chinese", "我有3.5个苹果和GPT-4模型，价格是￥100元！"),
    ("chinese", "“引号”《书名》——破折号…省略号"),
    ("japanese", "今日はいい天気ですね。公園に散歩に行きましょう！"),
    ("japanese", "Python で 簡単に使える　ツール！ＡＢＣ１２３です。"),
    ("japanese", "ｶﾀｶﾅとひらがな、3.5時間の旅。John's 犬"),
    ("korean", "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 정말 좋네요!"),
    ("korean", "대한민국의 수도는 서울입니다. 3.5시간 걸려요."),
    ("korean", "대형트럭이 대회장에 도착했다"),
    ("german", "Grüß Gott! Die Straße ist 3,5 km lang – größer als gedacht."),
    ("german", "Donaudampfschifffahrtsgesellschaftskapitän, „Anführungszeichen“ und Bindestrich-Wörter."),
    ("french", "L'été dernier, j'ai vu « trois » oiseaux à 7h30 — c'était génial !"),
    ("french", "Aujourd'hui, l'œuvre coûte 12,50 € (T.T.C.)."),
    ("spanish", "¿Dónde está el baño? ¡Aquí mismo, señor!"),
    ("russian", "Привет, мир! Это тест 2-го уровня."),
]

# Character pools for random texts per language (letters, digits, punctuation, whitespace).
POOLS: dict[str, str] = {
    "english": "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,!?'-\"()$%:;  \t\n",
    "german": "aäbcdeoöuüßsSÄÖÜ 0123 .,-–„“!?'  ",
    "french": "aàâçeéèêëiîïoôœuùûü l'j'c'  ,.«»—!?0123 ",
    "chinese": "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现与，。！？、“”；：abcXYZ123 ．－  ",
    "japanese": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトンーッャュョ日本語今天気公園散歩行ｶﾀﾅﾟﾞ、。！？「」・ＡＢ１２abc123 　 ",
    "korean": "가나다라마바사아자차카타파하는은이가를을에서의로도만대한민국서울오늘날씨정말좋네요안녕하세요만나반갑습니트럭회장학교 ,.!?123abc  ",
}


def _processor():
    # qwen_asr imports torch/transformers and nagisa prints DyNet's banner on stdout: keep stdout clean.
    with contextlib.redirect_stdout(io.StringIO()):
        from qwen_asr.inference.qwen3_forced_aligner import Qwen3ForceAlignProcessor

        return Qwen3ForceAlignProcessor()


def official_words(proc, text: str, language: str) -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        words, _ = proc.encode_timestamp(text, language)
    return list(words)


def official_repair(proc, values: list[float]) -> list[int]:
    import numpy as np

    # The official pipeline feeds class * 80.0 as float32 (an int64 tensor times a float).
    return [int(v) for v in proc.fix_timestamp(np.asarray(values, dtype=np.float32))]


def random_texts(rng: random.Random, per_language: int) -> list[tuple[str, str]]:
    cases = []
    for language, pool in POOLS.items():
        for _ in range(per_language):
            cases.append((language, "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))))
    return cases


def random_repairs(rng: random.Random, count: int) -> list[list[float]]:
    cases: list[list[float]] = [[0.0], [80.0, 0.0], [0.0, 0.0, 0.0]]
    for _ in range(count):
        n = rng.randint(1, 48)
        shape = rng.random()
        if shape < 0.4:  # mostly rising with outliers (what a trained aligner emits)
            base = sorted(rng.randint(0, 200) for _ in range(n))
            classes = [c if rng.random() > 0.25 else rng.randint(0, 200) for c in base]
        elif shape < 0.7:  # uniform noise
            classes = [rng.randint(0, 30) for _ in range(n)]
        elif shape < 0.85:  # falling
            classes = sorted((rng.randint(0, 200) for _ in range(n)), reverse=True)
        else:  # long outlier runs inside a rising sequence
            base = sorted(rng.randint(0, 400) for _ in range(n))
            start = rng.randint(0, n - 1)
            width = rng.randint(3, 8)
            classes = [rng.randint(0, 400) if start <= k < start + width else c for k, c in enumerate(base)]
        cases.append([c * 80.0 for c in classes])
    return cases


def write_fixtures() -> None:
    import qwen_asr.inference.qwen3_forced_aligner as official

    proc = _processor()
    rng = random.Random(20261126)
    text_cases = [
        {"language": lang, "text": text, "words": official_words(proc, text, lang)}
        for lang, text in HAND_PICKED + random_texts(rng, 25)
    ]
    repair_cases = [{"values": v, "repaired": official_repair(proc, v)} for v in random_repairs(rng, 300)]
    dict_path = Path(official.__file__).parent / "assets" / "korean_dict_jieba.dict"
    FIXTURES.mkdir(parents=True, exist_ok=True)
    meta = {
        "generator": "scripts/aligner_text_fixtures.py",
        "qwen_asr": _version("qwen-asr"),
        "nagisa": _version("nagisa"),
        "soynlp": _version("soynlp"),
        "korean_dict_sha256": hashlib.sha256(dict_path.read_bytes()).hexdigest(),
    }
    for name, cases in (("text_cases.json", text_cases), ("repair_cases.json", repair_cases)):
        # One case per line: small diffs when the official code or the cases change.
        lines = ",\n".join(json.dumps(case, ensure_ascii=False) for case in cases)
        text = f'{{"meta": {json.dumps(meta)},\n"cases": [\n{lines}\n]}}\n'
        (FIXTURES / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(text_cases)} text and {len(repair_cases)} repair cases to {FIXTURES}", file=sys.stderr)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def serve() -> None:
    proc = _processor()
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        if "repair" in request:
            reply = {"repaired": official_repair(proc, request["repair"])}
        else:
            reply = {"words": official_words(proc, request["words"], request.get("language", ""))}
        out.write(json.dumps(reply, ensure_ascii=False) + "\n")
        out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="answer JSON lines on stdin (test oracle)")
    if parser.parse_args().serve:
        serve()
    else:
        write_fixtures()


if __name__ == "__main__":
    main()
