"""Continuation of a cut output: the request that continues it, overlap removal, progress and
repetition guards, assembly.

Pure functions over strings and recorded requests, each linear in the text it looks at, so a
128K-token output costs no more to guard than to read.
"""

from .assemble import Decision, find_overlap, judge_segment, similarity
from .request import CONTINUE_NOTE, continuation_request

__all__ = ["CONTINUE_NOTE", "Decision", "continuation_request", "find_overlap", "judge_segment", "similarity"]
