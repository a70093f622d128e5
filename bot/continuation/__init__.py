"""Continuation of a cut output: overlap removal, progress and repetition guards, assembly.

Pure functions over strings, each linear in the text it looks at, so a 128K-token output costs no
more to guard than to read.
"""
from .assemble import Decision, find_overlap, judge_segment, similarity

__all__ = ["Decision", "find_overlap", "judge_segment", "similarity"]
