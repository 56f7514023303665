"""What the trusted client and the untrusted server share: the declared surface.

- ``protocol``: the frames, requests, answers, error codes and the login digest;
- ``storage``: the storage interface (``Storage``, ``RootRecord``, ``CommitResult``,
  quotas, durability modes, the limits every backend accepts);
- ``exceptions``: the errors of that interface.

This package imports nothing else of ``blob_server`` (and nothing of ``zerodb_core``), and
``zerodb_core`` imports nothing of ``blob_server`` but this package and, for embedded
stores only, the factory ``blob_server.storage.open_storage``; ``tests/test_layering.py``
enforces both. Changing anything here changes what both sides agree on.
"""
