"""The employee list (a GET filter form, paginated) and the employee detail page.

Plain ORM calls: the router sends them to the encrypted database, where the indexed
conditions (salary, hire date, department, full-text) are served by encrypted indexes and
the rest (``istartswith`` on the names, ``is_active``) is checked on decrypted records.
"""

from __future__ import annotations

import warnings

from django.core.paginator import Paginator, UnorderedObjectListWarning
from django.shortcuts import get_object_or_404, render

from hr.forms import EmployeeFilterForm
from hr.models import Employee

PER_PAGE = 20


def employee_list(request):
    form = EmployeeFilterForm(request.GET or None)
    employees = Employee.objects.select_related("department")
    if form.is_bound:
        employees = form.filter(employees)
    else:
        employees = employees.order_by("last_name", "first_name", "pk")
    with warnings.catch_warnings():
        # A search without a chosen ordering is ranked (BM25 score, ties by pk): a total
        # order that Django cannot see, so it would warn that pages may be inconsistent.
        warnings.simplefilter("ignore", UnorderedObjectListWarning)
        paginator = Paginator(employees, PER_PAGE)
    # get_page() turns a page number that is not a number or is past the end into the
    # first or the last page instead of an error.
    page = paginator.get_page(request.GET.get("page"))
    return render(
        request,
        "hr/employee_list.html",
        {
            "form": form,
            "page": page,
            "paginator": paginator,
            "searching": form.is_bound and bool(form.cleaned_data.get("q", "").strip()),
            "filtered": form.is_bound and any(v for k, v in request.GET.items() if k != "page"),
        },
    )


def employee_detail(request, pk: int):
    employee = get_object_or_404(Employee.objects.select_related("department"), pk=pk)
    return render(request, "hr/employee_detail.html", {"employee": employee})
