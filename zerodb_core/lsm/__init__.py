"""Log-structured trees: runs of exact changes, merged by size, read as one tree."""

from zerodb_core.lsm.merge import MERGE_FACTOR, merge_reader, merge_windows, small_runs
from zerodb_core.lsm.pending import Changes, Pending
from zerodb_core.lsm.postings import TextTree, merge_postings_reader
from zerodb_core.lsm.tree import LogTree

__all__ = [
    "MERGE_FACTOR",
    "Changes",
    "LogTree",
    "Pending",
    "TextTree",
    "merge_postings_reader",
    "merge_reader",
    "merge_windows",
    "small_runs",
]
