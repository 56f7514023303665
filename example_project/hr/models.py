"""The HR models. They live in the encrypted database (``ZERODB_APPS = ["hr"]``)."""

from django.db import models
from django.db.models.functions import Lower
from django.urls import reverse

from django_zerodb.indexes import TextIndex, TrigramIndex
from django_zerodb.managers import ZeroManager


class Department(models.Model):
    name = models.CharField(max_length=100, unique=True)
    budget = models.DecimalField(max_digits=14, decimal_places=2)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Employee(models.Model):
    first_name = models.CharField(max_length=50)
    last_name = models.CharField(max_length=50, db_index=True)
    email = models.EmailField(unique=True)
    title = models.CharField(max_length=100, blank=True)
    salary = models.IntegerField(db_index=True, help_text="Yearly, in dollars.")
    department = models.ForeignKey(Department, on_delete=models.PROTECT, related_name="employees")
    hire_date = models.DateField(db_index=True)
    is_active = models.BooleanField(default=True)
    bio = models.TextField(blank=True)

    # ZeroManager adds .search() (ranked full-text search on the TextIndex below).
    objects = ZeroManager()

    class Meta:
        ordering = ["last_name", "first_name", "id"]
        indexes = [
            TextIndex(fields=["bio"], name="employee_bio_text"),
            # Case-insensitive search: last_name__iexact / __istartswith, email__iexact
            # (the admin's "^last_name" and "=email"), and substrings of the bios.
            models.Index(Lower("last_name"), name="employee_lower_last_name"),
            models.Index(Lower("email"), name="employee_lower_email"),
            TrigramIndex(fields=["bio"], name="employee_bio_trgm"),
        ]

    def __str__(self):
        return f"{self.first_name} {self.last_name}"

    @property
    def full_name(self):
        return str(self)

    def get_absolute_url(self):
        return reverse("hr:employee_detail", args=[self.pk])
