"""The HR API (``/api/``): the encrypted models through ``django_zerodb.rest``.

``GET /api/employees/?salary__gte=...&department=...&search=kernel+panic&ordering=-salary``,
``POST /api/employees/query/`` (the JSON query language, docs/rest.md), the same for
departments, and the OpenAPI schema at ``/api/schema/``. Authentication: the admin's
session, or a token (``Authorization: Token <key>``); Django model permissions apply.
"""

from rest_framework import serializers

from django_zerodb.rest.routers import ZeroRouter
from django_zerodb.rest.viewsets import ZeroModelViewSet
from hr.models import Department, Employee


class DepartmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Department
        fields = ["id", "name", "budget"]


class EmployeeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Employee
        fields = [
            "id",
            "first_name",
            "last_name",
            "email",
            "title",
            "salary",
            "department",
            "hire_date",
            "is_active",
            "bio",
        ]


class EmployeeViewSet(ZeroModelViewSet):
    queryset = Employee.objects.all()
    serializer_class = EmployeeSerializer
    filterset_fields = {
        "salary": ["exact", "gte", "lte"],
        "department": ["exact"],
        "last_name": ["exact", "startswith"],
        "is_active": ["exact"],
        "hire_date": ["gte", "lte"],
    }
    ordering_fields = ["id", "salary", "last_name", "hire_date"]
    # The query endpoint may also filter on the department's name (across the relation).
    query_fields = {
        "first_name": "first_name",
        "last_name": "last_name",
        "email": "email",
        "title": "title",
        "salary": "salary",
        "hire_date": "hire_date",
        "is_active": "is_active",
        "bio": "bio",
        "department": "department",
        "department_name": "department__name",
    }


class DepartmentViewSet(ZeroModelViewSet):
    queryset = Department.objects.all()
    serializer_class = DepartmentSerializer
    filterset_fields = ["name"]
    ordering_fields = ["id", "name", "budget"]


router = ZeroRouter()
router.register("employees", EmployeeViewSet, basename="employee")
router.register("departments", DepartmentViewSet, basename="department")
