"""The admin of the encrypted HR models: plain ModelAdmins, served by the router.

(``django_zerodb.admin.ZeroModelAdmin`` will bring ranked search and plan display; the
admin here uses only what Django ships.)
"""

from django.contrib import admin
from django.db.models import Count

from hr.models import Department, Employee


class EmployeeInline(admin.TabularInline):
    model = Employee
    fields = ["first_name", "last_name", "email", "title", "salary", "hire_date", "is_active"]
    extra = 0
    show_change_link = True
    ordering = ["last_name", "first_name"]


@admin.register(Department)
class DepartmentAdmin(admin.ModelAdmin):
    list_display = ["name", "budget", "headcount"]
    search_fields = ["name"]
    inlines = [EmployeeInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(headcount=Count("employees"))

    @admin.display(ordering="headcount", description="Employees")
    def headcount(self, department):
        return department.headcount


@admin.register(Employee)
class EmployeeAdmin(admin.ModelAdmin):
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
    search_fields = ["first_name", "last_name", "email"]
    date_hierarchy = "hire_date"
    list_select_related = ["department"]
    list_per_page = 50
    fieldsets = [
        (None, {"fields": [("first_name", "last_name"), "email", "title", "department"]}),
        ("Employment", {"fields": ["salary", "hire_date", "is_active"]}),
        ("Bio", {"fields": ["bio"]}),
    ]
