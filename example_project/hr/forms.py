"""The GET filter form of the employee list."""

from __future__ import annotations

from django import forms
from django.db.models import Q, QuerySet

from hr.models import Department, Employee

# value -> (label, order_by). The list's default is by name, or by relevance when a
# full-text search is given.
ORDERINGS = {
    "name": ("Name", ("last_name", "first_name", "pk")),
    "-salary": ("Salary, highest first", ("-salary", "-pk")),
    "salary": ("Salary, lowest first", ("salary", "pk")),
    "hire_date": ("Hire date, earliest first", ("hire_date", "pk")),
    "-hire_date": ("Hire date, latest first", ("-hire_date", "-pk")),
}
ACTIVE_CHOICES = [("", "Any"), ("yes", "Active"), ("no", "Former")]


class EmployeeFilterForm(forms.Form):
    name = forms.CharField(
        required=False,
        max_length=50,
        label="Name",
        help_text="First or last name starts with",
        widget=forms.TextInput(attrs={"placeholder": "e.g. Jo", "type": "search"}),
    )
    q = forms.CharField(
        required=False,
        max_length=200,
        label="Full-text search",
        help_text='Every word must occur in the bio; "quoted phrases" in order',
        widget=forms.TextInput(attrs={"placeholder": "e.g. kubernetes", "type": "search"}),
    )
    department = forms.ModelChoiceField(
        queryset=Department.objects.all(), required=False, empty_label="Any department"
    )
    salary_min = forms.IntegerField(required=False, min_value=0, label="Salary from")
    salary_max = forms.IntegerField(required=False, min_value=0, label="Salary to")
    hired_from = forms.DateField(
        required=False, label="Hired from", widget=forms.DateInput(attrs={"type": "date"})
    )
    hired_to = forms.DateField(
        required=False, label="Hired to", widget=forms.DateInput(attrs={"type": "date"})
    )
    active = forms.ChoiceField(required=False, choices=ACTIVE_CHOICES, label="Status")
    ordering = forms.ChoiceField(
        required=False,
        choices=[("", "Default")] + [(value, label) for value, (label, _) in ORDERINGS.items()],
        label="Order by",
        help_text="Default: by name, or by relevance when searching",
    )

    def clean(self):
        data = super().clean()
        low, high = data.get("salary_min"), data.get("salary_max")
        if low is not None and high is not None and low > high:
            self.add_error("salary_max", "Must not be lower than “Salary from”.")
        start, end = data.get("hired_from"), data.get("hired_to")
        if start and end and start > end:
            self.add_error("hired_to", "Must not be before “Hired from”.")
        return data

    def filter(self, employees: QuerySet[Employee]) -> QuerySet[Employee]:
        """``employees`` narrowed by every field that is valid (invalid ones are ignored,
        and shown as errors by the template), then ordered."""
        if not hasattr(self, "cleaned_data"):
            self.is_valid()
        data = self.cleaned_data
        text = (data.get("q") or "").strip()
        if text:
            # Ranked: the best BM25 matches first, unless an ordering is chosen below.
            employees = employees.search(text)
        if name := (data.get("name") or "").strip():
            employees = employees.filter(
                Q(first_name__istartswith=name) | Q(last_name__istartswith=name)
            )
        if department := data.get("department"):
            employees = employees.filter(department=department)
        if data.get("salary_min") is not None:
            employees = employees.filter(salary__gte=data["salary_min"])
        if data.get("salary_max") is not None:
            employees = employees.filter(salary__lte=data["salary_max"])
        if data.get("hired_from"):
            employees = employees.filter(hire_date__gte=data["hired_from"])
        if data.get("hired_to"):
            employees = employees.filter(hire_date__lte=data["hired_to"])
        if active := data.get("active"):
            employees = employees.filter(is_active=active == "yes")
        ordering = data.get("ordering")
        if ordering in ORDERINGS:
            employees = employees.order_by(*ORDERINGS[ordering][1])
        elif not text:
            employees = employees.order_by(*ORDERINGS["name"][1])
        return employees
