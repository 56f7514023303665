"""The HR schema of ``tests/django/testapp`` (trimmed to what the benchmark queries),
created with the schema editor in each database of the benchmark; no migrations.

The same model classes serve every backend: queries pick theirs with ``.using(alias)``.
On SQLite and PostgreSQL the ``TextIndex`` would be a plain B-tree index on ``bio``,
which no query there uses; the benchmark replaces it (see ``django_side_by_side``).
"""

from django.db import models
from django.db.models.functions import Lower

from django_zerodb.indexes import TextIndex, TrigramIndex
from django_zerodb.managers import ZeroManager


class Department(models.Model):
    name = models.CharField(max_length=100, unique=True)


class Employee(models.Model):
    objects = ZeroManager()

    first_name = models.CharField(max_length=50, db_index=True)
    last_name = models.CharField(max_length=50)
    email = models.EmailField(unique=True)
    title = models.CharField(max_length=100, blank=True)
    salary = models.IntegerField(db_index=True, null=True)
    department = models.ForeignKey(
        Department, on_delete=models.CASCADE, null=True, related_name="employees"
    )
    bio = models.TextField(blank=True)

    class Meta:
        indexes = [TextIndex(fields=["bio"], name="bench_employee_bio_text")]
        ordering = ["id"]


class IndexedEmployee(models.Model):
    """The employees of ``bench.indexes``: case-insensitive and substring search."""

    last_name = models.CharField(max_length=50)
    email = models.EmailField()
    title = models.CharField(max_length=100, blank=True)
    bio = models.TextField(blank=True)

    class Meta:
        indexes = [
            models.Index(Lower("last_name"), name="bench_lower_last_name"),
            models.Index(Lower("email"), name="bench_lower_email"),
            TrigramIndex(fields=["bio"], name="bench_bio_trgm"),
        ]
