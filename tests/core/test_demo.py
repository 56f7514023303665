"""The realistic employees of ``zerodb_core.demo``: the data ``bench.write_cost`` measures
writes on, and byte-count tests will count on. Their shape is what makes the measure
realistic (a two-topic vocabulary hid a 20x write cost), so it is checked here: 5,000
words, Zipf frequencies, 40 words a description, the same data for the same seed."""

from __future__ import annotations

import math
import random
from collections import Counter

from zerodb_core.demo import (
    DESCRIPTION_WORDS,
    VOCABULARY,
    VOCABULARY_SIZE,
    plaintext_bytes,
    realistic_description,
    realistic_employee,
    realistic_employees,
    zipf_probability,
)
from zerodb_core.text import tokenize

RECORDS = 400  # 16,000 words: enough for the shape, well under a second


def words_of(employees: list[dict]) -> list[str]:
    return [w for e in employees for w in tokenize(e["description"])]


def test_vocabulary_is_5000_distinct_words_each_one_token():
    assert VOCABULARY_SIZE == len(VOCABULARY) == len(set(VOCABULARY)) == 5000
    for word in VOCABULARY:
        assert word.isascii() and word.isalpha() and word.islower()
        assert tokenize(word) == [word]


def test_vocabulary_is_the_same_everywhere():
    # Results of runs before and after an engine change are compared byte for byte:
    # the words must not depend on the process (hash seed) or the machine.
    assert VOCABULARY[:6] == ("o", "u", "a", "i", "tu", "fo")
    assert VOCABULARY[2500] == "klaikbind"


def test_frequent_words_are_short():
    head = sum(map(len, VOCABULARY[:100])) / 100
    tail = sum(map(len, VOCABULARY[-100:])) / 100
    assert head < tail / 3


def test_descriptions_have_40_vocabulary_words():
    vocabulary = set(VOCABULARY)
    for employee in realistic_employees(RECORDS, seed=3):
        tokens = tokenize(employee["description"])
        assert len(tokens) == DESCRIPTION_WORDS == 40
        assert set(tokens) <= vocabulary


def test_employees_have_the_demo_fields_and_salaries_in_steps_of_ten():
    for employee in realistic_employees(50, seed=4):
        assert set(employee) == {"name", "surname", "salary", "description"}
        assert 40_000 <= employee["salary"] < 250_000
        assert employee["salary"] % 10 == 0


def test_same_seed_same_employees_other_seed_others():
    assert realistic_employees(RECORDS, seed=7) == realistic_employees(RECORDS, seed=7)
    assert realistic_employees(RECORDS, seed=7) != realistic_employees(RECORDS, seed=8)
    rng = random.Random(7)
    assert [realistic_employee(rng) for _ in range(3)] == realistic_employees(3, seed=7)


def test_word_frequencies_follow_zipf():
    words = words_of(realistic_employees(RECORDS, seed=5))
    counts = Counter(words)
    total = len(words)
    harmonic = sum(1 / r for r in range(1, VOCABULARY_SIZE + 1))
    # The top word takes 1/H(5000), about 11% of all words.
    top = counts[VOCABULARY[0]] / total
    assert math.isclose(zipf_probability(1), 1 / harmonic)
    assert 0.095 < top < 0.125
    # Rank 2 about half as often as rank 1, rank 10 a tenth.
    assert 1.6 < counts[VOCABULARY[0]] / counts[VOCABULARY[1]] < 2.5
    assert 6 < counts[VOCABULARY[0]] / counts[VOCABULARY[9]] < 15
    # The ten most frequent words are about a third of the text (H(10) / H(5000)).
    head = sum(counts[w] for w in VOCABULARY[:10]) / total
    assert 0.28 < head < 0.37
    # ... and the long tail is there: thousands of different words in 16,000.
    assert len(counts) > 2500


def test_probabilities_sum_to_one():
    assert math.isclose(sum(zipf_probability(r) for r in range(1, VOCABULARY_SIZE + 1)), 1)


def test_plaintext_bytes_is_the_packed_record():
    # msgpack: a one-entry map (1 byte), the key "ab" (1 + 2), the small int 1 (1)
    assert plaintext_bytes({"ab": 1}) == 5
    employee = realistic_employees(1, seed=6)[0]
    assert len(employee["description"]) < plaintext_bytes(employee) < 1000


def test_description_reads_as_a_sentence():
    text = realistic_description(random.Random(1))
    assert text[0].isupper() and text.endswith(".")


def test_help_describes_the_demo(capsys):
    import pytest

    from zerodb_core import demo

    with pytest.raises(SystemExit) as done:
        demo.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: zerodb-demo")
    for mention in ("--store", "--employees", "ZERODB_PASSPHRASE", "round trips"):
        assert mention in text
