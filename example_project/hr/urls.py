from django.urls import path

from hr import views

app_name = "hr"
urlpatterns = [
    path("employees/", views.employee_list, name="employee_list"),
    path("employees/<int:pk>/", views.employee_detail, name="employee_detail"),
]
