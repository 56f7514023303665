"""Models of the backend tests: an HR schema like the example project's."""

from django.db import models
from django.db.models.functions import Lower

from django_zerodb.indexes import TextIndex, TrigramIndex
from django_zerodb.managers import ZeroManager


class Department(models.Model):
    name = models.CharField(max_length=100, unique=True)
    budget = models.DecimalField(max_digits=12, decimal_places=2, null=True)

    def __str__(self):
        return self.name


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
    hire_date = models.DateField(null=True, db_index=True)
    is_active = models.BooleanField(default=True)
    bio = models.TextField(blank=True)
    updated = models.DateTimeField(null=True)

    class Meta:
        indexes = [TextIndex(fields=["bio"], name="employee_bio_text")]
        ordering = ["id"]

    def __str__(self):
        return f"{self.first_name} {self.last_name}"


class Counter(models.Model):
    name = models.CharField(max_length=20, unique=True)
    value = models.IntegerField(default=0)


class Tag(models.Model):
    label = models.CharField(max_length=30)
    employees = models.ManyToManyField(Employee, related_name="tags")


class Project(models.Model):
    """Owned by a department (deleted with it); its lead may leave (SET_NULL)."""

    code = models.CharField(max_length=20)
    year = models.IntegerField()
    department = models.ForeignKey(Department, on_delete=models.CASCADE, related_name="projects")
    lead = models.ForeignKey(
        Employee, on_delete=models.SET_NULL, null=True, related_name="led_projects"
    )

    class Meta:
        unique_together = [("code", "year")]


class Assignment(models.Model):
    employee = models.ForeignKey(Employee, on_delete=models.CASCADE, related_name="assignments")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="assignments")
    role = models.CharField(max_length=30)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["employee", "project"], name="one_role_per_project")
        ]


class Badge(models.Model):
    """One per employee at most (OneToOne)."""

    employee = models.OneToOneField(Employee, on_delete=models.CASCADE, related_name="badge")
    number = models.CharField(max_length=10, unique=True)


class Setting(models.Model):
    """A model whose primary key is given, not allocated."""

    key = models.CharField(max_length=40, primary_key=True)
    value = models.CharField(max_length=100, blank=True)


class Booking(models.Model):
    """Write-time checks the store does not make itself (django_zerodb/constraints.py):
    two check constraints, a positive integer field and a JSONField."""

    seats = models.PositiveIntegerField()
    price = models.DecimalField(max_digits=8, decimal_places=2)
    starts = models.DateField()
    ends = models.DateField(null=True, blank=True)
    extra = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(price__gte=0), name="price_not_negative"),
            models.CheckConstraint(
                condition=models.Q(ends__gte=models.F("starts")), name="ends_after_start"
            ),
        ]


class Contact(models.Model):
    """The indexes Django users declare (issue 15): a case-insensitive unique e-mail, a
    ``Lower`` index on a name, a conditional unique constraint, a trigram index."""

    last_name = models.CharField(max_length=50)
    email = models.CharField(max_length=100)
    primary = models.BooleanField(default=False)
    bio = models.TextField(blank=True)

    class Meta:
        indexes = [
            models.Index(Lower("last_name"), name="contact_lower_last_name"),
            TrigramIndex(fields=["bio"], name="contact_bio_trgm"),
        ]
        constraints = [
            models.UniqueConstraint(Lower("email"), name="contact_email_ci"),
            models.UniqueConstraint(
                fields=["last_name"], condition=models.Q(primary=True), name="one_primary"
            ),
        ]
