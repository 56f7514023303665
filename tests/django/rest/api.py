"""The API the tests of ``django_zerodb.rest`` call: viewsets over the testapp models."""

from rest_framework import serializers

from django_zerodb.rest.pagination import ZeroCursorPagination
from django_zerodb.rest.routers import ZeroRouter
from django_zerodb.rest.viewsets import ZeroModelViewSet
from tests.django.testapp.models import Department, Employee, Tag


class DepartmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Department
        fields = ["id", "name", "budget"]


class EmployeeSerializer(serializers.ModelSerializer):
    # A renamed field (queried as "surname") and a computed one (not queryable).
    surname = serializers.CharField(source="last_name")
    display = serializers.SerializerMethodField()

    class Meta:
        model = Employee
        fields = [
            "id",
            "first_name",
            "surname",
            "email",
            "title",
            "salary",
            "department",
            "hire_date",
            "is_active",
            "bio",
            "updated",
            "display",
        ]

    def get_display(self, obj) -> str:
        return str(obj)


class EmployeeViewSet(ZeroModelViewSet):
    queryset = Employee.objects.all()
    serializer_class = EmployeeSerializer
    filterset_fields = {
        "salary": ["exact", "gte", "lte"],
        "department": ["exact", "isnull"],
        "first_name": ["exact", "startswith"],
        "is_active": ["exact"],
        "hire_date": ["gte", "lt"],
        "bio": ["search"],
    }
    ordering_fields = ["id", "salary", "first_name", "last_name", "email", "hire_date"]


class DepartmentViewSet(ZeroModelViewSet):
    queryset = Department.objects.all()
    serializer_class = DepartmentSerializer
    filterset_fields = ["name"]


class EmailCursorPagination(ZeroCursorPagination):
    ordering = "email"
    page_size = 5


class EmployeeCursorViewSet(EmployeeViewSet):
    pagination_class = EmailCursorPagination


class EmployeeHRViewSet(EmployeeViewSet):
    """The query endpoint with an explicit allow-list, across the department relation."""

    query_fields = {
        "first_name": "first_name",
        "salary": "salary",
        "bio": "bio",
        "department_name": "department__name",
        "department_budget": "department__budget",
    }


router = ZeroRouter()
router.register("employees", EmployeeViewSet, basename="employee")
router.register("departments", DepartmentViewSet, basename="department")
router.register("employees-by-email", EmployeeCursorViewSet, basename="employee-by-email")
router.register("employees-hr", EmployeeHRViewSet, basename="employee-hr")
TagViewSet = router.register_model(Tag, fields=["id", "label", "employees"])
