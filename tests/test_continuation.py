"""Continuation guards: exact overlap removal, progress and repetition, as pure functions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from residents.continuation import find_overlap, judge_segment, similarity


def naive_overlap(prior: str, new: str, min_overlap: int = 1) -> int:
    for k in range(min(len(prior), len(new)), 0, -1):
        if prior.endswith(new[:k]):
            return k if k >= min_overlap else 0
    return 0


texts = st.text(alphabet=st.sampled_from("ab c\n.é😀"), max_size=60)


@settings(max_examples=400, deadline=None)
@given(texts, texts, st.integers(1, 6))
def test_overlap_is_the_longest_prefix_suffix_match(prior, new, m):
    assert find_overlap(prior, new, m) == naive_overlap(prior, new, m)


@settings(max_examples=300, deadline=None)
@given(texts, texts, texts)
def test_assembly_is_prior_plus_new_minus_exactly_the_overlap(prior, shared, fresh):
    """Whatever a segment re-emits of the prior tail is removed once, and no other character is lost."""
    prior = prior + shared
    new = shared + fresh
    k = find_overlap(prior, new, 1)
    assembled = prior + new[k:]
    assert k >= len(shared)
    assert assembled.startswith(prior)
    assert assembled[len(prior) :] == new[k:]
    assert len(assembled) == len(prior) + len(new) - k
    assert prior.endswith(new[:k])


def test_overlap_from_a_specimen_shape():
    first = "Orchard under parapet from almanac to"
    rest = " parapet from almanac toFoundry under threshold"
    assert find_overlap(first, rest, 8) == len(" parapet from almanac to")


def test_short_accidental_matches_below_the_minimum_are_kept_as_text():
    assert find_overlap("went to", "o the sea", 8) == 0
    assert find_overlap("went to", "o the sea", 1) == 1


def test_an_exact_echo_adds_nothing_and_ends_with_no_progress():
    prior = "Lantern of meadow with lantern of parapet in sluice that beacon. " * 10
    d = judge_segment(prior, prior, min_overlap=8, min_progress=16, similarity_abort=0.92)
    assert d.verdict == "no-progress" and d.added == "" and d.overlap == len(prior)


def test_a_near_echo_ends_with_repetition():
    prior = "The river bends past the mill and the old stone bridge, slow and brown. " * 8
    echo = prior.replace("brown", "Brown")  # not an exact overlap, but the same text again
    d = judge_segment(prior, echo, min_overlap=8, min_progress=16, similarity_abort=0.92)
    assert d.verdict == "repetition" and d.overlap == 0


def test_real_progress_is_appended():
    prior = "The river bends past the mill and"
    new = " the mill and then runs under the bridge towards the sea, where gulls wait."
    d = judge_segment(prior, new, min_overlap=8, min_progress=16, similarity_abort=0.92)
    assert d.verdict == "append"
    assert (
        prior + d.added
        == "The river bends past the mill and then runs under the bridge towards the sea, where gulls wait."
    )


def test_whitespace_stripped_from_a_prefill_and_re_emitted_is_not_doubled():
    prior = "the tide came in \n"
    d = judge_segment(
        prior,
        " \nand the boats lifted off the mud together.",
        min_overlap=8,
        min_progress=16,
        similarity_abort=0.92,
        stripped_tail=" \n",
    )
    assert prior + d.added == "the tide came in \nand the boats lifted off the mud together."


def test_similarity_is_bounded_and_cheap_on_large_inputs():
    big = "abcdefghij" * 200_000  # 2 MB
    assert similarity(big, big[:5000]) == 1.0
    assert 0.0 <= similarity(big, "zzzz" * 1000) < 0.5
