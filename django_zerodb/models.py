"""The backend's one model, kept in the *default* (plaintext) database: the highest root
seen of each encrypted database, so a store rolled back while this process was not
running is still detected (see ``django_zerodb.freshness``)."""

from __future__ import annotations

from django.db import models


class SeenRoot(models.Model):
    """The highest ``(seq, digest)`` any process of this project has seen of one encrypted
    database. Sequence numbers and digests of ciphertext: nothing secret."""

    alias = models.CharField(max_length=100, blank=True, help_text="DATABASES alias")
    store = models.CharField(
        max_length=500, help_text="the store (absolute for SQLite) and, remotely, the tenant"
    )
    database = models.CharField(max_length=200, help_text="database name in the store")
    seq = models.PositiveBigIntegerField()
    digest = models.CharField(max_length=64, blank=True, help_text="BLAKE2b-256, hex")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["store", "database"], name="zerodb_seenroot_unique")
        ]

    def __str__(self) -> str:
        return f"{self.store} {self.database}: seq {self.seq}"
