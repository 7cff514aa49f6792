"""Render the shipped STEM corpus and questions from the structured facts in ``facts.py``.

    python -m handlers.stem.build_data          # rewrites handlers/stem/data/{corpus,questions}.jsonl
    python -m handlers.stem.build_data --check  # exit 1 when the shipped files are out of date

Passages are rendered from the facts, and every computed answer is computed here from the same
facts the passages state (the molar mass of water from the atomic weights in the hydrogen and
oxygen passages, ...), so a question can never disagree with its supporting documents.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from handlers.stem import facts

DATA_DIR = Path(__file__).resolve().parent / "data"
CORPUS_FILE = DATA_DIR / "corpus.jsonl"
QUESTIONS_FILE = DATA_DIR / "questions.jsonl"

_PERIOD_ENDS = (2, 10, 18, 36, 54, 86, 118)
_GASES = {1, 2, 7, 8, 9, 10, 17, 18, 36, 54, 86}
_LIQUIDS = {35, 80}
_ALKALI = {3, 11, 19, 37, 55, 87}
_ALKALINE_EARTH = {4, 12, 20, 38, 56, 88}
_METALLOIDS = {5, 14, 32, 33, 51, 52}
_HALOGENS = {9, 17, 35, 53, 85, 117}
_NOBLE = {2, 10, 18, 36, 54, 86, 118}
_NONMETALS = {1, 6, 7, 8, 15, 16, 34}
_POST_TRANSITION = {13, 31, 49, 50, 81, 82, 83, 84, 113, 114, 115, 116}
#: IUPAC spellings where the periodictable package uses the American ones
_IUPAC_NAMES = {"aluminum": ("aluminium", "aluminum"), "cesium": ("caesium", "cesium")}
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def element_by_symbol() -> dict[str, tuple[int, str, str, float | None]]:
    return {symbol: (number, symbol, _iupac(name)[0], mass) for number, symbol, name, mass in facts.ELEMENTS}


def _iupac(name: str) -> tuple[str, str | None]:
    return _IUPAC_NAMES.get(name, (name, None))


def _period(number: int) -> int:
    return next(i for i, end in enumerate(_PERIOD_ENDS, 1) if number <= end)


def _position(number: int) -> tuple[int | None, str]:
    """(group or None for the lanthanides/actinides, block)."""
    period = _period(number)
    offset = number - (_PERIOD_ENDS[period - 2] if period > 1 else 0)
    if period == 1:
        return (1, "s") if number == 1 else (18, "s")
    if period <= 3:
        group = offset if offset <= 2 else offset + 10
    elif period <= 5:
        group = offset
    else:
        if 3 <= offset <= 17:
            return None, "f"
        group = offset if offset <= 2 else offset - 14
    block = "s" if group <= 2 else "d" if group <= 12 else "p"
    return group, block


def _category(number: int) -> str:
    if 57 <= number <= 71:
        return "a lanthanide"
    if 89 <= number <= 103:
        return "an actinide"
    for members, label in ((_ALKALI, "an alkali metal"), (_ALKALINE_EARTH, "an alkaline earth metal"),
                           (_METALLOIDS, "a metalloid"), (_HALOGENS, "a halogen"), (_NOBLE, "a noble gas"),
                           (_NONMETALS, "a reactive nonmetal"), (_POST_TRANSITION, "a post-transition metal")):
        if number in members:
            return label
    return "a transition metal"


def element_passage(number: int, symbol: str, name: str, mass: float | None) -> dict[str, str]:
    name, other_spelling = _iupac(name)
    title = name.capitalize()
    group, block = _position(number)
    where = (f"group {group}, period {_period(number)}" if group is not None
             else f"period {_period(number)}, in the {'lanthanide' if number < 89 else 'actinide'} series")
    parts = [f"{title} is a chemical element with the symbol {symbol} and atomic number {number}"
             + (f" (also spelled {other_spelling})." if other_spelling else ".")]
    parts.append(f"It is {_category(number)} in {where} of the periodic table ({block}-block).")
    if mass is not None:
        parts.append(f"Its standard atomic weight is {mass:g}, so one mole of {name} atoms has a mass of "
                     f"about {mass:g} grams.")
    else:
        parts.append("It has no stable isotopes and no standard atomic weight.")
    if number >= 84 or number in (43, 61):
        parts.append("All of its isotopes are radioactive.")
    if number >= 104:
        parts.append("It is a synthetic superheavy element made only a few atoms at a time; most of its "
                     "chemical properties are predicted rather than measured.")
    elif number in _GASES:
        parts.append("It is a gas at room temperature and standard pressure.")
    elif number in _LIQUIDS:
        parts.append("It is a liquid at room temperature and standard pressure.")
    elif number <= 99 and number not in (85, 87):  # astatine and francium were never seen in bulk
        parts.append("It is a solid at room temperature.")
    return {"id": f"element-{name}", "title": f"{title} (element {number})", "text": " ".join(parts)}


def constant_passage(slug: str, name: str, symbol: str, value: str, unit: str, exact: bool,
                     note: str) -> dict[str, str]:
    if slug in facts.DEFINING_CONSTANTS:
        exactness = "This value is exact: it is one of the defining constants of the SI since 2019."
    elif exact:
        exactness = "It is exact in the SI, being derived from defining constants (the value shown may be rounded)."
    else:
        exactness = "This is the CODATA 2022 recommended value, which has a measurement uncertainty."
    text = f"The {name} ({symbol}) has the value {value} {unit}. {exactness} {note}"
    return {"id": f"constant-{slug}", "title": f"{name[0].upper() + name[1:]} (physical constant)", "text": text}


def planet_passage(index: int, planet: tuple[Any, ...]) -> dict[str, str]:
    name, mass, diameter, distance, period, gravity, day, moons, note = planet
    text = (f"{name} is the {_ORDINALS[index]} planet from the Sun, {note}. Its mass is {mass:g}e24 kg and its "
            f"equatorial diameter {diameter:,} km. Its mean distance from the Sun is {distance:g} million km, "
            f"and it orbits the Sun once every {period:g} Earth days. The gravitational acceleration at its "
            f"surface is {gravity:g} m/s^2, and a solar day on {name} lasts {day:g} hours. It has {moons}.")
    return {"id": f"planet-{name.lower()}", "title": f"{name} (planet)", "text": text}


def compound_passage(slug: str, name: str, formula: str, counts: dict[str, int], note: str) -> dict[str, str]:
    elements = element_by_symbol()
    atoms = ", ".join(f"{count} {elements[symbol][2]} atom{'s' if count > 1 else ''}"
                      for symbol, count in counts.items())
    text = f"{name} is a chemical compound with the formula {formula}: each molecule has {atoms}. {note}"
    return {"id": f"compound-{slug}", "title": f"{name} ({formula})", "text": text}


def corpus() -> list[dict[str, str]]:
    docs = [element_passage(*row) for row in facts.ELEMENTS]
    docs += [constant_passage(*row) for row in facts.CONSTANTS]
    docs += [planet_passage(i, row) for i, row in enumerate(facts.PLANETS)]
    docs += [compound_passage(*row) for row in facts.COMPOUNDS]
    for group in (facts.PASSAGES, facts.EXPERIMENTS, facts.UNITS, facts.CHEMISTRY, facts.BIOLOGY, facts.GEOGRAPHY):
        docs += [{"id": doc_id, "title": title, "text": text} for doc_id, title, text in group]
    return docs


# --- questions ------------------------------------------------------------------------------

def _molar_mass(slug: str) -> float:
    elements = element_by_symbol()
    counts = next(row[3] for row in facts.COMPOUNDS if row[0] == slug)
    total = 0.0
    for symbol, count in counts.items():
        mass = elements[symbol][3]
        assert mass is not None, f"{symbol} (in {slug}) has no standard atomic weight"
        total += mass * count
    return total


def _constant(slug: str) -> float:
    return float(next(row[3] for row in facts.CONSTANTS if row[0] == slug))


def _planet(name: str) -> tuple[Any, ...]:
    return next(row for row in facts.PLANETS if row[0] == name)


def _compound_docs(slug: str) -> list[str]:
    elements = element_by_symbol()
    counts = next(row[3] for row in facts.COMPOUNDS if row[0] == slug)
    return [f"compound-{slug}", *(f"element-{elements[symbol][2]}" for symbol in counts)]


def _numeric(value: float) -> str:
    return f"{value:.6g}"


def questions() -> list[dict[str, Any]]:
    c = _constant("speed-of-light")
    h, ev = _constant("planck-constant"), _constant("electronvolt")
    sun_mass, proxima_ly, parsec_ly, au_m = 1.989e30, 4.24, 3.2616, 149_597_870_700
    rows: list[dict[str, Any]] = []

    def add(question: str, answer: str, answer_type: str, docs: list[str], tolerance: float = 0.0,
            aliases: tuple[str, ...] = ()) -> None:
        # an answer stated in a passage, as opposed to one computed from the passages' numbers
        computed = answer_type == "numeric" and tolerance > 0 and answer != "5730"
        rows.append({"id": f"stem-{len(rows) + 1:03d}", "question": question, "answer": answer,
                     "aliases": list(aliases), "answer_type": answer_type, "tolerance": tolerance,
                     "supporting_doc_ids": docs, "requires_computation": computed})

    for slug, name in (("water", "water (H2O)"), ("carbon-dioxide", "carbon dioxide (CO2)"),
                       ("glucose", "glucose (C6H12O6)"), ("sodium-chloride", "sodium chloride (NaCl)"),
                       ("caffeine", "caffeine (C8H10N4O2)")):
        add(f"Using the standard atomic weights in the reference documents, what is the molar mass of "
            f"{name} in grams per mole?", _numeric(_molar_mass(slug)), "numeric", _compound_docs(slug), 1e-3)
    add("What is the atomic number of the element tungsten?", "74", "numeric", ["element-tungsten"])
    add("What is the chemical symbol of the element antimony?", "Sb", "exact", ["element-antimony"])
    add("Who measured the elementary charge by balancing charged oil droplets in an electric field?",
        "Robert Millikan", "exact", ["exp-millikan-oil-drop"],
        aliases=("Millikan", "Robert A. Millikan", "Robert Andrews Millikan"))
    add("How many seconds does light take to travel one astronomical unit?", _numeric(au_m / c), "numeric",
        ["astro-au", "constant-speed-of-light"], 1e-3)
    add("What is the weight in newtons of a 70 kg astronaut standing on Mars, using the surface gravity of "
        "Mars given in the reference?", _numeric(70 * _planet("Mars")[5]), "numeric", ["planet-mars"], 1e-2)
    add("In what year was the Michelson–Morley experiment on the speed of light performed?", "1887",
        "numeric", ["exp-michelson-morley"])
    add("What is the energy in electronvolts of a photon with a wavelength of 500 nanometres?",
        _numeric(h * c / 500e-9 / ev), "numeric",
        ["constant-planck-constant", "constant-speed-of-light", "constant-electronvolt", "exp-photoelectric"], 1e-2)
    add("Which nucleotide base takes the place of thymine in RNA?", "uracil", "exact", ["bio-rna"],
        aliases=("U",))
    add("How many bones does an adult human skeleton have?", "206", "numeric", ["bio-skeleton"])
    add("By how many metres is Mount Everest higher than K2?", _numeric(8848.86 - 8611), "numeric",
        ["geo-everest", "geo-k2"], 1e-2)
    add("Which lake is the deepest lake in the world?", "Lake Baikal", "exact", ["geo-baikal"],
        aliases=("Baikal",))
    add("What particle did James Chadwick identify in 1932?", "neutron", "exact", ["exp-chadwick"],
        aliases=("neutrons",))
    add("What is the Schwarzschild radius of the Sun in kilometres, using the solar mass in the reference?",
        _numeric(2 * _constant("gravitational-constant") * sun_mass / c**2 / 1000), "numeric",
        ["astro-schwarzschild", "astro-sun", "constant-gravitational-constant"], 1e-2)
    add("How far away is Proxima Centauri in parsecs?", _numeric(proxima_ly / parsec_ly), "numeric",
        ["astro-proxima", "astro-parsec"], 1e-2)
    add("What pressure in kilopascals does one mole of an ideal gas exert in a volume of 10 litres at "
        "300 K?", _numeric(_constant("gas-constant") * 300 / 0.010 / 1000), "numeric",
        ["chem-ideal-gas-law", "constant-gas-constant"], 1e-2)
    add("Which noble gas has the atomic number 54?", "xenon", "exact", ["element-xenon"], aliases=("Xe",))
    add("What is the SI unit of magnetic flux density?", "tesla", "exact", ["unit-tesla"], aliases=("T", "teslas"))
    add("How many Earth years does Mars take to orbit the Sun?", _numeric(_planet("Mars")[4] / 365.25),
        "numeric", ["planet-mars"], 1e-2)
    add("At what wavelength in nanometres does the Sun's photosphere radiate most strongly, by Wien's "
        "displacement law and the surface temperature in the reference?",
        _numeric(_constant("wien-constant") / 5772 * 1e9), "numeric", ["constant-wien-constant", "astro-sun"], 1e-2)
    add("What is the largest moon in the Solar System?", "Ganymede", "exact", ["astro-ganymede"])
    add("How long in years is the half-life of carbon-14?", "5730", "numeric", ["chem-half-life"], 1e-2)
    assert not math.isnan(sum(float(r["answer"]) for r in rows if r["answer_type"] == "numeric"))
    return rows


def render() -> dict[Path, str]:
    """The shipped files' contents, one JSON object per line."""
    def lines(rows: list[dict[str, Any]]) -> str:
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return {CORPUS_FILE: lines(corpus()), QUESTIONS_FILE: lines(questions())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the shipped files are current")
    args = parser.parse_args(argv)
    stale = [path for path, text in render().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run python -m handlers.stem.build_data", file=sys.stderr)
        return 1 if stale else 0
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in render().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({text.count(chr(10))} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
