"""What an entry of a run does to the runs below it (see :mod:`zerodb_core.btree.node`)."""

PUT = 0  # adds a key that was absent
REPLACE = 1  # gives a present key a new value
DELETE = 2  # removes a present key (a tombstone, with an empty value)
