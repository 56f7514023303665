"""The admin of the encrypted HR models, on ``django_zerodb.admin.ZeroModelAdmin``.

* Employee: filters by department, status and hire date, the date hierarchy, every
  column sortable, and a search served by the indexes: last name prefix (indexed:
  case-sensitive), first name prefix, exact email (unique index) and the full-text index
  of the bios (``@bio``: ranked when no column is sorted).
* Department: its first employees inline (``EmployeeInline.max_shown``; a department
  of hundreds would render a form for each: megabytes, seconds), with the head count
  and a link to all of them in the employee list.
* The index links to the "Encrypted store" page (``django_zerodb.admin.urls``).
"""

from django.contrib import admin
from django.db.models import Count
from django.forms.models import BaseInlineFormSet
from django.urls import reverse
from django.utils.html import format_html

from django_zerodb.admin import ZeroModelAdmin
from hr.models import Department, Employee

admin.site.index_template = "django_zerodb/admin/index.html"


class FirstEmployeesFormSet(BaseInlineFormSet):
    """The first ``max_shown`` employees of the department (in the inline's ordering)."""

    max_shown = 20

    def get_queryset(self):
        if not hasattr(self, "_first"):
            self._first = super().get_queryset()[: self.max_shown]
        return self._first


class EmployeeInline(admin.TabularInline):
    model = Employee
    formset = FirstEmployeesFormSet
    fields = ["first_name", "last_name", "email", "title", "salary", "hire_date", "is_active"]
    extra = 0
    show_change_link = True
    ordering = ["last_name", "first_name"]
    verbose_name_plural = f"employees (the first {FirstEmployeesFormSet.max_shown})"


@admin.register(Department)
class DepartmentAdmin(ZeroModelAdmin):
    list_display = ["name", "budget", "headcount"]
    search_fields = ["^name"]
    ordering = ["name"]  # a unique index: paged by the index
    inlines = [EmployeeInline]
    readonly_fields = ["all_employees"]

    @admin.display(description="Employees")
    def all_employees(self, department):
        """The head count, and a link to the employee list filtered on the department."""
        if department.pk is None:
            return "-"
        url = reverse("admin:hr_employee_changelist")
        count = department.employees.count()
        return format_html(
            '<a href="{}?department__id__exact={}">all {} employees</a>',
            url,
            department.pk,
            count,
        )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(headcount=Count("employees"))

    @admin.display(ordering="headcount", description="Employees")
    def headcount(self, department):
        return department.headcount


@admin.register(Employee)
class EmployeeAdmin(ZeroModelAdmin):
    list_display = [
        "last_name",
        "first_name",
        "email",
        "title",
        "department",
        "salary",
        "hire_date",
        "is_active",
    ]
    list_display_links = ["last_name", "first_name"]
    list_filter = ["department", "is_active", "hire_date"]
    search_fields = ["^last_name", "^first_name", "=email", "@bio"]
    date_hierarchy = "hire_date"
    list_select_related = ["department"]
    fieldsets = [
        (None, {"fields": [("first_name", "last_name"), "email", "title", "department"]}),
        ("Employment", {"fields": ["salary", "hire_date", "is_active"]}),
        ("Bio", {"fields": ["bio"]}),
    ]
