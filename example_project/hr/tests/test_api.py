"""The HR API with DRF's test client (token authentication, as a script would use)."""

from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from hr.models import Employee
from hr.tests.test_models import EncryptedTestCase


class ApiTests(EncryptedTestCase):
    def setUp(self):
        admin = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=admin)}")

    def test_query_endpoint(self):
        body = {"filter": {"salary": {"$gte": 100_000}}, "order_by": ["-salary"]}
        answer = self.client.post("/api/employees/query/", body, format="json").json()
        self.assertEqual(answer["count"], 2)
        self.assertEqual([e["first_name"] for e in answer["results"]], ["Grace", "Ada"])

    def test_delete_of_a_department_with_employees_is_409(self):
        response = self.client.delete(f"/api/departments/{self.kernel.pk}/")
        self.assertEqual(response.status_code, 409)
        self.assertEqual(Employee.objects.filter(department=self.kernel).count(), 3)

    def test_credentials_are_needed(self):
        self.assertEqual(APIClient().get("/api/employees/").status_code, 401)
