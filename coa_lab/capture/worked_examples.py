"""The teacher's prompt engineering: hand-written worked runs of the whole team.

A 135M model given only an instruction writes prose where code should be (0/16 on
"What is 6411 plus 788?"); given the instruction plus two worked examples as earlier chat
turns it writes the right program almost every time. So each agent of the multi-agent
teacher gets, as prior user/assistant turns, the two worked runs most similar to its task
(`nearest`), each agent seeing only the part of the run that is its own job.

This is exactly the manual prompt engineering that distillation removes: the single CoA
model is trained and evaluated with its short zero-shot prompt and never sees these.
The facts below are written by hand (well-known films and people) and are not taken from
any shipped task file, so no train or eval answer leaks into a prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkedRun:
    """One solved task, agent by agent."""

    question: str
    plan: str  # planner
    step: str  # thinker: what the tool must find
    call: str  # coder: one Python line / searcher: the query
    observation: str  # what the tool returned
    reflection: str  # reflector
    conclusion: str  # thinker, after the result
    answer: str  # answerer


def _arith(question: str, plan: str, step: str, expr: str, value: int, conclusion: str) -> WorkedRun:
    return WorkedRun(question, plan, step, f"print({expr})", str(value),
                     f"The code ran and printed {value}.", conclusion, str(value))


_ONE = "Compute it with one line of Python, then report the printed number."
_STORY = "Write the story as one Python expression, run it, then report the printed number."

MATH: tuple[WorkedRun, ...] = (
    _arith("What is 5212 minus 847?", _ONE, "I need 5212 - 847.", "5212 - 847", 4365, "The answer is 4365."),
    _arith("What is 3090 plus 4466?", _ONE, "I need 3090 + 4466.", "3090 + 4466", 7556, "The answer is 7556."),
    _arith("What is 43 times 218?", _ONE, "I need 43 * 218.", "43 * 218", 9374, "The answer is 9374."),
    _arith("What is 6552 divided by 24?", _ONE, "I need 6552 // 24.", "6552 // 24", 273, "The answer is 273."),
    _arith("A warehouse holds 6120 boxes. 2815 boxes are shipped out and 604 new boxes arrive. How many boxes "
           "are in the warehouse now?", _STORY, "Start with 6120, take away 2815, add 604: 6120 - 2815 + 604.",
           "6120 - 2815 + 604", 3909, "The warehouse has 3909 boxes."),
    _arith("Ana buys 14 packs of 36 stickers and gives away 95 stickers. How many stickers does Ana have left?",
           _STORY, "Packs times stickers per pack, minus the ones given away: 14 * 36 - 95.", "14 * 36 - 95", 409,
           "Ana has 409 stickers left."),
    _arith("A library has 18 shelves with 64 books on each shelf. It buys 350 more books. How many books does "
           "the library have now?", _STORY, "Shelves times books per shelf, plus the new books: 18 * 64 + 350.",
           "18 * 64 + 350", 1502, "The library has 1502 books."),
    _arith("A train carries 2210 passengers. At the first stop 1432 passengers get on and 908 get off. How many "
           "passengers are on the train now?", _STORY, "Start with 2210, add 1432 who get on, take away 908: "
           "2210 + 1432 - 908.", "2210 + 1432 - 908", 2734, "There are 2734 passengers."),
    _arith("A farm has 310 hens and 45 cows. Each hen lays 5 eggs a week. This week the farm sells 1200 eggs "
           "and buys 380 eggs. How many eggs does the farm have at the end of the week?", _STORY,
           "Only hens lay eggs: 310 * 5, minus 1200 sold, plus 380 bought: 310 * 5 - 1200 + 380.",
           "310 * 5 - 1200 + 380", 730, "The farm has 730 eggs."),
    _arith("Ben is 40 years old and saves 320 dollars a month for 9 months, then spends 700 dollars on a bike "
           "and 450 dollars on books. How many dollars does Ben have left?", _STORY,
           "His age does not matter: 320 * 9, minus 700, minus 450: 320 * 9 - 700 - 450.",
           "320 * 9 - 700 - 450", 1730, "Ben has 1730 dollars left."),
    _arith("A school with 640 students orders 25 boxes of 30 pencils and 16 boxes of 12 pens. How many pencils "
           "and pens does the school order in total?", _STORY,
           "The students do not matter: 25 * 30 pencils plus 16 * 12 pens: 25 * 30 + 16 * 12.",
           "25 * 30 + 16 * 12", 942, "The school orders 942 pencils and pens."),
    _arith("A bakery with 12 workers bakes 20 trays of 24 rolls each day for 5 days and sells 1500 rolls. How "
           "many rolls are left?", _STORY, "The workers do not matter: 20 * 24 * 5 rolls, minus 1500 sold: "
           "20 * 24 * 5 - 1500.", "20 * 24 * 5 - 1500", 900, "There are 900 rolls left."),
)


def _lookup(question: str, subject: str, what: str, passage: str, answer: str) -> WorkedRun:
    return WorkedRun(question, f"Search for {subject} and read {what} in the passage.",
                     f"I need {what} of {subject}.", subject, f"(1) {subject}: {passage}",
                     f"The first passage is about {subject} and gives {what}.",
                     f"The passage says {answer}.", answer)


MHQA: tuple[WorkedRun, ...] = (
    _lookup("Who directed the film Casablanca?", "Casablanca", "the director",
            "Casablanca is a 1942 American romantic drama film directed by Michael Curtiz and starring Humphrey "
            "Bogart and Ingrid Bergman.", "Michael Curtiz"),
    _lookup("When was Marie Curie born?", "Marie Curie", "the date of birth",
            "Marie Salomea Skłodowska Curie( 7 November 1867 – 4 July 1934) was a Polish and naturalised-French "
            "physicist and chemist.", "7 November 1867"),
    _lookup("When did Charles Dickens die?", "Charles Dickens", "the date of death",
            "Charles John Huffam Dickens( February 7, 1812 – June 9, 1870) was an English writer and social critic.",
            "June 9, 1870"),
    _lookup("Where was Ludwig van Beethoven born?", "Ludwig van Beethoven", "the place of birth",
            "Ludwig van Beethoven( baptised 17 December 1770 – 26 March 1827) was a German composer and pianist. "
            "He was born in Bonn.", "Bonn"),
    _lookup("Where did Frida Kahlo die?", "Frida Kahlo", "the place of death",
            "Frida Kahlo( 6 July 1907 – 13 July 1954) was a Mexican painter. She died in Coyoacán.", "Coyoacán"),
    _lookup("In what year was the film Metropolis released?", "Metropolis", "the release year",
            "Metropolis is a 1927 German expressionist science-fiction silent film directed by Fritz Lang.", "1927"),
    _lookup("Who was the father of Elizabeth I?", "Elizabeth I", "the father",
            "Elizabeth I( 7 September 1533 – 24 March 1603) was Queen of England. She was the daughter of "
            "Henry VIII and Anne Boleyn.", "Henry VIII"),
    _lookup("Who was the mother of Alexander the Great?", "Alexander the Great", "the mother",
            "Alexander III of Macedon, known as Alexander the Great, was a king of Macedon. He was the son of "
            "Philip II and his wife Olympias.", "Olympias"),
    _lookup("Who was the spouse of Pierre Curie?", "Pierre Curie", "the spouse",
            "Pierre Curie( 15 May 1859 – 19 April 1906) was a French physicist. In 1895 he married Marie "
            "Skłodowska.", "Marie Skłodowska"),
    _lookup("What country was Akira Kurosawa a citizen of?", "Akira Kurosawa", "the country of citizenship",
            "Akira Kurosawa( 23 March 1910 – 6 September 1998) was a Japanese film director and screenwriter.",
            "Japanese"),
    # A second run per relation: with two examples of the question's own relation before it,
    # the reader copies the span the cue word points at ("directed by", "son of", "born")
    # instead of the first name in the passage.
    _lookup("Who directed the film Jaws?", "Jaws", "the director",
            "Jaws is a 1975 American thriller film directed by Steven Spielberg and based on the novel by "
            "Peter Benchley. It stars Roy Scheider and Robert Shaw.", "Steven Spielberg"),
    _lookup("When was Serena Williams born?", "Serena Williams", "the date of birth",
            "Serena Jameka Williams( born September 26, 1981) is an American former professional tennis player.",
            "September 26, 1981"),
    _lookup("When did Albert Einstein die?", "Albert Einstein", "the date of death",
            "Albert Einstein( 14 March 1879 – 18 April 1955) was a German- born theoretical physicist.",
            "18 April 1955"),
    _lookup("Where was Wolfgang Amadeus Mozart born?", "Wolfgang Amadeus Mozart", "the place of birth",
            "Wolfgang Amadeus Mozart( 27 January 1756 – 5 December 1791) was a composer of the Classical period. "
            "He was born in Salzburg, the son of Leopold Mozart.", "Salzburg"),
    _lookup("Where did Vincent van Gogh die?", "Vincent van Gogh", "the place of death",
            "Vincent Willem van Gogh( 30 March 1853 – 29 July 1890) was a Dutch painter. He died in "
            "Auvers-sur-Oise, France.", "Auvers-sur-Oise"),
    _lookup("In what year was the film Psycho released?", "Psycho", "the release year",
            "Psycho is a 1960 American horror film directed and produced by Alfred Hitchcock.", "1960"),
    _lookup("Who was the father of Wolfgang Amadeus Mozart?", "Wolfgang Amadeus Mozart", "the father",
            "Wolfgang Amadeus Mozart( 27 January 1756 – 5 December 1791) was a composer. He was the son of "
            "Leopold Mozart and Anna Maria Pertl.", "Leopold Mozart"),
    _lookup("Who was the mother of Elizabeth I?", "Elizabeth I", "the mother",
            "Elizabeth I( 7 September 1533 – 24 March 1603) was Queen of England. She was the daughter of "
            "Henry VIII and his second wife, Anne Boleyn.", "Anne Boleyn"),
    _lookup("Who was the spouse of Franklin D. Roosevelt?", "Franklin D. Roosevelt", "the spouse",
            "Franklin Delano Roosevelt( January 30, 1882 – April 12, 1945) was the 32nd president of the United "
            "States. In 1905 he married Eleanor Roosevelt.", "Eleanor Roosevelt"),
    _lookup("What country was Orson Welles a citizen of?", "Orson Welles", "the country of citizenship",
            "George Orson Welles( May 6, 1915 – October 10, 1985) was an American director, actor and writer.",
            "American"),
)

BANK: dict[str, tuple[WorkedRun, ...]] = {"math": MATH, "code": MATH, "mhqa": MHQA}

_WORD = re.compile(r"[a-z]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))  # letters only: numbers say nothing about the kind of task


def nearest(profile: str, question: str, k: int = 2) -> list[WorkedRun]:
    """The k worked runs whose wording is most like `question` (Jaccard over words), least
    similar first, so the closest example sits right before the real task."""
    bank = BANK.get(profile, ())
    words = _words(question)

    def similarity(run: WorkedRun) -> float:
        other = _words(run.question)
        return len(words & other) / max(1, len(words | other))

    return sorted(bank, key=similarity, reverse=True)[:k][::-1]
